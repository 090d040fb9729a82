package pipeline

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// pathColumns reads paths the scanner's shortcuts touch: a node of more
// than byKeyMin children (a, looked up through pathNode.byKey), one of
// fewer (a.c, compared child by child), values under a key that may repeat
// (a.c.d, a.f3.g), and array indexes with their aliases up to maxIdx 2 of
// a and 1 of a.2.
var pathColumns = func() []Column {
	var cols []Column
	add := func(from string, t Type) {
		cols = append(cols, Column{Name: fmt.Sprintf("c%d", len(cols)), From: from, Type: t})
	}
	for i := range 10 {
		add(fmt.Sprintf("json:a.f%d", i), TypeText)
	}
	for _, p := range []string{"json:a", "json:a.c", "json:a.c.d", "json:a.c.e", "json:a.f3.g",
		"json:a.0", "json:a.1", "/a/01", "/a/+1", "json:a.2", "json:a.1.x", "json:a.2.1", "json:a.2.1.y", "json:z"} {
		add(p, TypeText)
	}
	add("payload", TypeJSONB)
	return cols
}()

// pathPayloads repeat keys with objects and scalars under them, index
// arrays below, at and beyond maxIdx, and name keys out of column order
// and through escapes.
var pathPayloads = []string{
	`{"a":{"c":{"d":1,"e":2}},"a":{"c":{"e":3}}}`,
	`{"a":{"c":{"d":1,"e":2},"c":{"e":3},"f1":1,"f1":{"x":2}}}`,
	`{"a":{"c":{"d":1},"c":5}}`,
	`{"a":{"c":5,"c":{"d":1}}}`,
	`{"a":{"c":{"d":{"q":1}},"c":{"d":[2]},"c":{"e":0}},"z":1,"z":{"a":1}}`,
	`{"a":{"f3":{"g":1},"f3":2,"f3":{"h":3}}}`,
	`{"a":{"f3":{"g":1},"f3":{"g":{"k":[1]}},"f9":9,"f0":0,"f5":"five"}}`,
	`{"a":{"f9":9,"f8":8,"f7":7,"f6":6,"f5":5,"f4":4,"f3":3,"f2":2,"f1":1,"f0":0,"c":{"e":1,"d":2}}}`,
	`{"a":{"f0":0,"f2":2,"f1":1,"x":0,"f4":4,"f3":3,"\u0066\u0036":6,"f7":[7],"c":{"d":1},"f7":{}}}`,
	`{"a":{"\u0063":{"d":1},"c":{"\u0064":2}}}`,
	`{"a":[]}`, `{"a":[0]}`, `{"a":[0,{"x":1}]}`, `{"a":[0,{"x":1},[5,{"y":6}]]}`,
	`{"a":[0,{"x":1},[5,{"y":6},7],3,4,{"x":5}]}`,
	`{"a":[0,{"x":1},[5,{"y":6}]],"a":[9]}`,
	`{"a":[0,{"x":1},[5,{"y":6}]],"a":[9,8,7]}`,
	`{"a":[0,{"x":1},2],"a":{"1":"one","01":"zero-one","2":{"1":{"y":"o"}}}}`,
	`{"a":{"1":{"x":1},"1":2,"+1":3,"+1":{"x":4}}}`,
	`{"z":0,"a":0,"a":{"f0":1},"a":[1,2,3],"a":null}`,
	`[{"a":1}]`, `"a"`,
}

// TestPathsReadTheLastOfDuplicateKeys holds AppendTuple to the reference
// encoder (fastjson and refGet, which reads the last of duplicate keys)
// on pathPayloads and the same payloads with their keys reversed,
// through one Encoder, so that values recorded for one payload or for an
// earlier duplicate cannot leak into another's columns.
func TestPathsReadTheLastOfDuplicateKeys(t *testing.T) {
	m := mustCompile(t, pathColumns...)
	enc, ref := m.NewEncoder(0), newRefEncoder(m, 0)
	for _, p := range pathPayloads {
		for _, p := range []string{p, p, strings.ReplaceAll(p, `"a"`, `"\u0061"`)} {
			ev := &Event{Data: []byte(p)}
			got, gerr := enc.AppendTuple(nil, ev)
			want, werr := ref.AppendTuple(nil, ev)
			if gerr != nil || werr != nil {
				t.Fatalf("%s: scanner %v, reference %v", p, gerr, werr)
			}
			if !bytes.Equal(got, want) {
				gf, wf := fields(t, got), fields(t, want)
				for i := range gf {
					if !bytes.Equal(gf[i], wf[i]) || (gf[i] == nil) != (wf[i] == nil) {
						t.Errorf("%s: %s = %q, want %q", p, pathColumns[i].From, gf[i], wf[i])
					}
				}
			}
		}
	}
}

// TestPathsLastWinsValues spells out what a few of those payloads store,
// so that the test above does not rest on the reference alone.
func TestPathsLastWinsValues(t *testing.T) {
	m := mustCompile(t, pathColumns...)
	col := map[string]int{}
	for i, c := range pathColumns {
		col[c.From] = i
	}
	enc := m.NewEncoder(0)
	for _, c := range []struct {
		payload string
		want    map[string]string // From -> text, "NULL" for SQL NULL
	}{
		{`{"a":{"c":{"d":1,"e":2}},"a":{"c":{"e":3}}}`, map[string]string{"json:a.c.d": "NULL", "json:a.c.e": "3", "json:a.c": `{"e":3}`}},
		{`{"a":{"c":{"d":1},"c":5}}`, map[string]string{"json:a.c.d": "NULL", "json:a.c": "5"}},
		{`{"a":{"c":5,"c":{"d":1}}}`, map[string]string{"json:a.c.d": "1"}},
		{`{"a":{"f3":{"g":1},"f3":2,"f3":{"h":3}}}`, map[string]string{"json:a.f3.g": "NULL", "json:a.f3": `{"h":3}`}},
		{`{"a":{"f9":9,"f0":0,"f5":"five","f0":"zero"}}`, map[string]string{"json:a.f9": "9", "json:a.f0": "zero", "json:a.f5": "five", "json:a.f4": "NULL"}},
		{`{"a":[0,{"x":1},[5,{"y":6}]],"a":[9]}`, map[string]string{"json:a.0": "9", "json:a.1": "NULL", "json:a.1.x": "NULL", "json:a.2.1.y": "NULL"}},
		{`{"a":[0,{"x":1},[5,{"y":6},7],3,{"x":5}]}`, map[string]string{"json:a.1.x": "1", "/a/01": `{"x":1}`, "/a/+1": `{"x":1}`, "json:a.2.1.y": "6", "json:a.2": `[5,{"y":6},7]`}},
		{`{"a":{"1":{"x":1},"1":2,"+1":3,"+1":{"x":4}}}`, map[string]string{"json:a.1": "2", "json:a.1.x": "NULL", "/a/+1": `{"x":4}`, "/a/01": "NULL"}},
	} {
		tup, err := enc.AppendTuple(nil, &Event{Data: []byte(c.payload)})
		if err != nil {
			t.Fatalf("%s: %v", c.payload, err)
		}
		f := fields(t, tup)
		for from, want := range c.want {
			got := "NULL"
			if v := f[col[from]]; v != nil {
				got = string(v)
			}
			if got != want {
				t.Errorf("%s: %s = %s, want %s", c.payload, from, got, want)
			}
		}
	}
}

// TestPathsKeysInAnyOrder reads flat mappings of 5 columns (each key
// compared, kids[next] first) and of 40 (the root's byKey map) from
// payloads whose keys come in column order, reversed and shuffled, with
// keys no column reads between them.
func TestPathsKeysInAnyOrder(t *testing.T) {
	for _, n := range []int{5, 40} {
		var cols []Column
		for i := range n {
			cols = append(cols, Column{Name: fmt.Sprintf("k%d", i), From: fmt.Sprintf("json:k%d", i), Type: TypeInt8})
		}
		enc := mustCompile(t, cols...).NewEncoder(0)
		orders := map[string][]int{"in order": {}, "reversed": {}, "shuffled": {}}
		for i := range n {
			orders["in order"] = append(orders["in order"], i)
			orders["reversed"] = append(orders["reversed"], n-1-i)
			orders["shuffled"] = append(orders["shuffled"], (i*7+3)%n) // 7 is prime to 5 and 40
		}
		for name, order := range orders {
			var sb strings.Builder
			sb.WriteString(`{"x":0`)
			for _, i := range order {
				fmt.Fprintf(&sb, `,"k%d":%d,"y%d":-1`, i, 100+i, i)
			}
			sb.WriteString("}")
			tup, err := enc.AppendTuple(nil, &Event{Data: []byte(sb.String())})
			if err != nil {
				t.Fatalf("%d columns, %s: %v", n, name, err)
			}
			for i, f := range fields(t, tup) {
				if !bytes.Equal(f, be64(uint64(100+i))) {
					t.Errorf("%d columns, %s: k%d = %x, want %d", n, name, i, f, 100+i)
				}
			}
		}
	}
}
