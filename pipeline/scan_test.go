package pipeline

import (
	"bytes"
	"errors"
	"testing"
)

// TestScanArrayIndexAliases: "1", "01" and "+1" all index element 1 of an
// array (as fastjson's Get reads them), yet they are different trie nodes,
// since as object keys they differ. Each must get the element, with its
// own subtree.
func TestScanArrayIndexAliases(t *testing.T) {
	m := mustCompile(t,
		Column{Name: "a1", From: "json:a.1", Type: TypeText},
		Column{Name: "a01", From: "/a/01", Type: TypeText},
		Column{Name: "ap1", From: "/a/+1", Type: TypeText},
		Column{Name: "a01x", From: "/a/01/x", Type: TypeInt8},
		Column{Name: "a1x", From: "json:a.1.x", Type: TypeInt8},
	)
	cases := []struct {
		payload string
		want    [][]byte
	}{
		{`{"a":["p",{"x":7}]}`, [][]byte{[]byte(`{"x":7}`), []byte(`{"x":7}`), []byte(`{"x":7}`), be64(7), be64(7)}},
		{`{"a":{"1":"one","01":"zero-one"}}`, [][]byte{[]byte("one"), []byte("zero-one"), null, null, null}},
	}
	for _, c := range cases {
		tup, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(c.payload)})
		if err != nil {
			t.Fatalf("%s: %v", c.payload, err)
		}
		for i, f := range fields(t, tup) {
			if (f == nil) != (c.want[i] == nil) || !bytes.Equal(f, c.want[i]) {
				t.Errorf("%s: column %d = %q, want %q", c.payload, i, f, c.want[i])
			}
		}
	}
}

// TestHeaderJSONBNumberRange: a header value bound for jsonb follows the
// jsonb rules, numbers beyond numeric's range included (PostgreSQL refuses
// them with SQLSTATE 22003, which cost the sink a batch bisect).
func TestHeaderJSONBNumberRange(t *testing.T) {
	m := mustCompile(t, Column{Name: "h", From: "header:H", Type: TypeJSONB})
	cases := []struct {
		hdr  string
		code string
	}{
		{`1e131071`, ""},
		{`{"a":[-1e-16383,"1e999999",true,null,1.5E+3]}`, ""},
		{`0e1000001`, ""}, // zero: PostgreSQL takes any exponent below 2^30-1
		{`1e131072`, CodeOutOfRange},
		{`[1,{"k":1e-16384}]`, CodeOutOfRange},
		{`-1e999999999999`, CodeOutOfRange},
	}
	for _, c := range cases {
		_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Header: map[string][]string{"H": {c.hdr}}})
		var de *DecodeError
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: %v", c.hdr, err)
		case c.code != "" && (!errors.As(err, &de) || de.Code != c.code):
			t.Errorf("%s: err = %v, want %s", c.hdr, err, c.code)
		}
	}
}

// TestNumericHugeExponentOfZero: PostgreSQL's numeric input limits the
// exponent to |e| < 2^30-1 (INT_MAX/2) and then only the value's weight
// and scale; zero with a large positive exponent is zero.
func TestNumericHugeExponentOfZero(t *testing.T) {
	cols := []Column{{Name: "n", From: "json:v", Type: TypeNumeric}, {Name: "j", From: "payload", Type: TypeJSONB}}
	m := mustCompile(t, cols...)
	for _, c := range []struct {
		v    string
		code string
	}{
		{"0e1000001", ""},
		{"-0.00e1073741822", ""},
		{"0e1073741823", CodeOutOfRange},
		{"0e-16384", CodeOutOfRange},
		{"0e-1000001", CodeOutOfRange},
		{"1e1000001", CodeOutOfRange},
	} {
		tup, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{"v":` + c.v + `}`)})
		var de *DecodeError
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: %v", c.v, err)
		case c.code == "":
			if f := fields(t, tup); !bytes.Equal(f[0], numericBytes(0, numericPosSign, 0)) {
				t.Errorf("%s: numeric %x, want zero", c.v, f[0])
			}
		case !errors.As(err, &de) || de.Code != c.code:
			t.Errorf("%s: err = %v, want %s", c.v, err, c.code)
		}
	}
}
