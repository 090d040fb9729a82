package pipeline

import (
	"bytes"
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
