package pipeline

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
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

// FuzzHeaderJSONBMatchesPayload: a header value bound for jsonb and a
// payload both go through the scanner (and a header value through
// textNumbersFit); both must take and refuse the same texts, with the same
// codes, but for a value inside 300 arrays or objects, which only the
// payload refuses (fastjson's parser counts it as depth 301).
func FuzzHeaderJSONBMatchesPayload(f *testing.F) {
	for _, s := range []string{`{"a":[1e131071,-1e-16383,"1e999999"]}`, `[1e131072]`, `{"k":-1.5E+3,"e":true}`, `"\u0000"`, `0e1000001`,
		`-0.` + strings.Repeat("0", 70) + `1`, `{"a":"\"1e999999"}`, "{\"a\":\"\x01\\\\n\"}", `[` + strings.Repeat("1", 131073) + `]`,
		strings.Repeat("[", 300) + "1" + strings.Repeat("]", 300)} { // the header takes it, the payload does not
		f.Add(s)
	}
	hdr := mustCompile(f, Column{Name: "h", From: "header:H", Type: TypeJSONB}).NewEncoder(0)
	body := mustCompile(f, Column{Name: "b", From: "payload", Type: TypeJSONB}).NewEncoder(0)
	f.Fuzz(func(t *testing.T, s string) {
		_, herr := hdr.AppendTuple(nil, &Event{Header: map[string][]string{"H": {s}}})
		_, berr := body.AppendTuple(nil, &Event{Data: []byte(s)})
		var hde, bde *DecodeError
		errors.As(herr, &hde)
		errors.As(berr, &bde)
		switch {
		case herr == nil && berr == nil:
		case herr == nil && strings.Contains(berr.Error(), "nested deeper than"):
		case herr == nil || berr == nil || hde.Code != bde.Code:
			t.Fatalf("%q:\nheader:  %v\npayload: %v", s, herr, berr)
		}
	})
}

// TestBadLiteralRefusedCheaply: fastjson words a value that starts like
// true, false or null and is not one by quoting the whole rest of the
// text, once per level of nesting: a 1 MiB payload took seconds and
// gigabytes to refuse, and the reason (logged, and a dead letter's header)
// held the payload. Values of the same kinds are refused with a short
// reason that quotes none of it, as payloads and as header values.
func TestBadLiteralRefusedCheaply(t *testing.T) {
	m := mustCompile(t, Column{Name: "b", From: "payload", Type: TypeJSONB}, Column{Name: "h", From: "header:H", Type: TypeJSONB})
	tail := strings.Repeat("\x01", 1<<18) // raw control bytes: 256 KiB of them
	for _, p := range []string{
		`{"a": nope, "ssn":"123-45-6789"}`,
		`{"a": n` + tail,
		strings.Repeat("[", 299) + "f" + tail,
		`["\u0041\n", tru ` + tail,
		`{"a":"` + "\x01" + `\n", "b": ` + strings.Repeat("[", 299) + "n" + tail, // a raw control character first
		`{"a":"\ud800", "b": ` + strings.Repeat("[", 299) + "n" + tail,           // a lone surrogate first
		`{"a": [1, 2` + strings.Repeat(" ", 1<<18) + `"ssn"`,                     // a structural error
		strings.Repeat("[", 299) + "1 2" + tail,                                  // one, deep
		strings.Repeat("[", 299) + "[1], n" + tail,                               // past the depth limit first
	} {
		start := time.Now()
		_, perr := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(p), Header: map[string][]string{"H": {"1"}}})
		_, herr := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte("1"), Header: map[string][]string{"H": {p}}})
		for _, err := range []error{perr, herr} {
			var de *DecodeError
			if !errors.As(err, &de) || de.Code != CodeInvalidJSON || len(de.Reason) > 200 || strings.Contains(de.Reason, "ssn") {
				t.Errorf("%.40q...: %.300v, want a short invalid_json quoting nothing of the input", p, err)
			}
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%.40q...: %v to refuse", p, d)
		}
	}
}

// TestDeepNestingRefusedCheaply: fastjson's validator has no depth limit
// and words its error once per level, so on deep unbalanced input it took
// time and memory quadratic in the depth (10 KB of "[" took 36 s and 9 GB
// to refuse, 1 MiB would stall a worker for good) and gave a reason as
// long as that. Payloads and header values nested beyond 300 are refused
// without it, with a short reason.
func TestDeepNestingRefusedCheaply(t *testing.T) {
	m := mustCompile(t, Column{Name: "b", From: "payload", Type: TypeJSONB}, Column{Name: "h", From: "header:H", Type: TypeJSONB})
	for _, p := range []string{strings.Repeat("[", 2000), strings.Repeat(`{"a":`, 2000) + "1", strings.Repeat("[", 1<<20),
		strings.Repeat("[", 400) + strings.Repeat("]", 400), `["\"[[[[` + strings.Repeat("[", 400) + `"]x`} {
		start := time.Now()
		_, perr := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(p), Header: map[string][]string{"H": {"1"}}})
		_, herr := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte("1"), Header: map[string][]string{"H": {p}}})
		for _, err := range []error{perr, herr} {
			var de *DecodeError
			if !errors.As(err, &de) || de.Code != CodeInvalidJSON || len(de.Reason) > 200 {
				t.Errorf("%.20q...: %.200v, want a short invalid_json", p, err)
			}
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%.20q...: %v to refuse", p, d)
		}
	}
}

// A value inside 300 arrays: a header value bound for jsonb takes it, as
// it did with fastjson.Validate and as PostgreSQL does; the payload
// refuses it (fastjson's parser counted it as depth 301), saying why.
func TestHeaderTakesAValueInside300Arrays(t *testing.T) {
	m := mustCompile(t, Column{Name: "b", From: "payload", Type: TypeJSONB}, Column{Name: "h", From: "header:H", Type: TypeJSONB})
	deep := strings.Repeat("[", 300) + "1" + strings.Repeat("]", 300)
	if _, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte("1"), Header: map[string][]string{"H": {deep}}}); err != nil {
		t.Errorf("header value inside 300 arrays: %v, want it taken", err)
	}
	_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(deep), Header: map[string][]string{"H": {"1"}}})
	if de, ok := err.(*DecodeError); !ok || de.Code != CodeInvalidJSON || !strings.Contains(de.Reason, "nested deeper than 300") {
		t.Errorf("payload inside 300 arrays: %v, want invalid_json, nested deeper than 300", err)
	}
	for _, hv := range []string{strings.Repeat("[", 301) + strings.Repeat("]", 301), strings.Repeat("[", 301) + "1" + strings.Repeat("]", 301)} {
		_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte("1"), Header: map[string][]string{"H": {hv}}})
		if de, ok := err.(*DecodeError); !ok || de.Code != CodeInvalidJSON {
			t.Errorf("header value inside 301 arrays: %v, want invalid_json", err)
		}
	}
}
