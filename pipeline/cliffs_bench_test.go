package pipeline

// Benchmarks of the decode path's worst shapes (session 63, BENCHMARKS.md):
// wide mappings, keys out of column order, repeated keys and arrays under
// a mapped key, numbers the jsonb range check reads, large events through
// the worker.

import (
	"fmt"
	"strings"
	"testing"
)

// runShape benchmarks AppendTuple of one payload under one column list.
func runShape(b *testing.B, cols []Column, payload []byte) {
	b.Helper()
	enc := mustCompile(b, cols...).NewEncoder(2 << 20)
	ev := &Event{Data: payload, Subject: "events.x"}
	buf := make([]byte, 0, 4<<20)
	if _, err := enc.AppendTuple(buf[:0], ev); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = enc.AppendTuple(buf[:0], ev)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// wide returns an object of n keys field_0000..; values alternate strings and ints.
func wide(n int, reverse bool) []byte {
	var sb strings.Builder
	sb.WriteByte('{')
	for k := 0; k < n; k++ {
		i := k
		if reverse {
			i = n - 1 - k
		}
		if k > 0 {
			sb.WriteByte(',')
		}
		if i%2 == 0 {
			fmt.Fprintf(&sb, `"field_%04d":"value-%d"`, i, i)
		} else {
			fmt.Fprintf(&sb, `"field_%04d":%d`, i, i*7)
		}
	}
	sb.WriteByte('}')
	return []byte(sb.String())
}

func wideCols(n int) []Column {
	cols := make([]Column, n)
	for i := range cols {
		t := TypeText
		if i%2 == 1 {
			t = TypeInt8
		}
		cols[i] = Column{Name: fmt.Sprintf("c%d", i), From: fmt.Sprintf("json:field_%04d", i), Type: t}
	}
	return cols
}

func BenchmarkCliffBaseline(b *testing.B) { runShape(b, benchColumns, benchPayload) }

func BenchmarkCliffWide(b *testing.B) {
	for _, n := range []int{8, 20, 50, 100, 300} {
		b.Run(fmt.Sprintf("cols=%d/inorder", n), func(b *testing.B) { runShape(b, wideCols(n), wide(n, false)) })
		b.Run(fmt.Sprintf("cols=%d/reversed", n), func(b *testing.B) { runShape(b, wideCols(n), wide(n, true)) })
	}
}

// 500-key event, 8 or 300 mapped columns of the same key length, none of the unread keys matching.
func BenchmarkCliffUnreadKeys(b *testing.B) {
	var sb strings.Builder
	sb.WriteByte('{')
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&sb, `"other_%04d":%d,`, i, i)
	}
	sb.WriteString(`"field_0000":"x","field_0001":1}`)
	p := []byte(sb.String())
	for _, n := range []int{2, 8, 50, 300} {
		b.Run(fmt.Sprintf("cols=%d", n), func(b *testing.B) { runShape(b, wideCols(n), p) })
	}
}

func padded(size int, atEnd bool) []byte {
	fields := `"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","seq":123456,"device":"dev-0042"`
	var sb strings.Builder
	sb.WriteByte('{')
	if !atEnd {
		sb.WriteString(fields + ",")
	}
	sb.WriteString(`"blob":[`)
	for i := 0; sb.Len() < size-120; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"k":"abcdefghij","n":12345}`)
	}
	sb.WriteString(`]`)
	if atEnd {
		sb.WriteString("," + fields)
	}
	sb.WriteByte('}')
	return []byte(sb.String())
}

var threeCols = []Column{
	{Name: "id", From: "json:id", Type: TypeUUID},
	{Name: "seq", From: "json:seq", Type: TypeInt8},
	{Name: "device", From: "json:device", Type: TypeText},
}

func BenchmarkCliffLarge(b *testing.B) {
	for _, size := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20} {
		for _, end := range []bool{false, true} {
			b.Run(fmt.Sprintf("size=%d/atEnd=%v", size, end), func(b *testing.B) { runShape(b, threeCols, padded(size, end)) })
		}
		b.Run(fmt.Sprintf("size=%d/jsonb-payload", size), func(b *testing.B) {
			runShape(b, append(threeCols[:3:3], Column{Name: "body", From: "payload", Type: TypeJSONB}), padded(size, false))
		})
		b.Run(fmt.Sprintf("size=%d/jsonb-subtree", size), func(b *testing.B) {
			runShape(b, append(threeCols[:3:3], Column{Name: "blob", From: "json:blob", Type: TypeJSONB}), padded(size, false))
		})
		b.Run(fmt.Sprintf("size=%d/text-subtree", size), func(b *testing.B) {
			runShape(b, append(threeCols[:3:3], Column{Name: "blob", From: "json:blob", Type: TypeText}), padded(size, false))
		})
	}
}

// strings: plain, \u escapes, surrogate pairs; read into text or not read.
func BenchmarkCliffEscapes(b *testing.B) {
	mk := func(unit string) []byte {
		return []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","s":"` + strings.Repeat(unit, 100<<10/len(unit)) + `"}`)
	}
	for _, c := range []struct{ name, unit string }{
		{"plain", "abcdef"}, {"utf8", "é€😀"}, {"u00e9", `\u00e9`}, {"surrogate", `\ud83d\ude00`}, {"n", `\n`}, {"quote", `\"`},
	} {
		p := mk(c.unit)
		b.Run(c.name+"/unread", func(b *testing.B) { runShape(b, threeCols[:1], p) })
		b.Run(c.name+"/text", func(b *testing.B) {
			runShape(b, []Column{threeCols[0], {Name: "s", From: "json:s", Type: TypeText}}, p)
		})
		b.Run(c.name+"/jsonb", func(b *testing.B) {
			runShape(b, []Column{threeCols[0], {Name: "s", From: "json:s", Type: TypeJSONB}}, p)
		})
	}
}

// numbers: an array of 100 KiB of numbers in several forms, unread, with a jsonb payload column.
func BenchmarkCliffNumbers(b *testing.B) {
	for _, c := range []struct{ name, num string }{
		{"int", "1234567"}, {"dec", "0.00001234"}, {"exp", "1.234e-05"}, {"long63", strings.Repeat("7", 63)}, {"long64", strings.Repeat("7", 64)},
		{"long1000", strings.Repeat("7", 1000)}, {"bigexp", "1e999999"},
	} {
		var sb strings.Builder
		sb.WriteString(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","a":[`)
		for i := 0; sb.Len() < 100<<10; i++ {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(c.num)
		}
		sb.WriteString(`]}`)
		p := []byte(sb.String())
		b.Run(c.name, func(b *testing.B) { runShape(b, threeCols[:1], p) })
	}
}

func BenchmarkCliffDeep(b *testing.B) {
	for _, d := range []int{10, 100, 299} {
		p := []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","deep":` + strings.Repeat(`{"a":`, d-1) + `1` + strings.Repeat(`}`, d-1) + `}`)
		b.Run(fmt.Sprintf("unread/d=%d", d), func(b *testing.B) { runShape(b, threeCols[:1], p) })
		path := "json:deep" + strings.Repeat(".a", d-2)
		b.Run(fmt.Sprintf("read/d=%d", d), func(b *testing.B) {
			runShape(b, []Column{threeCols[0], {Name: "x", From: path, Type: TypeText}}, p)
		})
	}
}

// Hostile shapes: ~1 MiB events against a 300-column mapping under one key "a".
func hostileCols(n int) []Column {
	cols := []Column{threeCols[0]}
	for i := 0; i < n; i++ {
		cols = append(cols, Column{Name: fmt.Sprintf("c%d", i), From: fmt.Sprintf("json:a.field_%04d", i), Type: TypeText})
	}
	return cols
}

func repeatTo(prefix, unit, suffix string, size int) []byte {
	return []byte(prefix + strings.Repeat(unit, (size-len(prefix)-len(suffix))/len(unit)) + suffix)
}

func BenchmarkCliffHostile(b *testing.B) {
	const size = 1 << 20
	id := `{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab"`
	shapes := []struct {
		name string
		p    []byte
	}{
		{"benign-array", repeatTo(id+`,"b":[0`, `,0`, `]}`, size)},
		{"array-under-a", repeatTo(id+`,"a":[0`, `,0`, `]}`, size)},
		{"dupkey-a-scalar", repeatTo(id, `,"a":0`, `}`, size)},
		{"dupkey-a-object", repeatTo(id, `,"a":{}`, `}`, size)},
		{"dupkey-a-field", repeatTo(id, `,"a":{"field_0000":0}`, `}`, size)},
		{"missing-keys-samelen-in-a", repeatTo(id+`,"a":{"zzzzzzzzzz":0`, `,"zzzzzzzzzz":0`, `}}`, size)},
		{"missing-keys-samelen-root", repeatTo(id+`,"x":0`, `,"zzzzzzzzzz":0`, `}`, size)},
	}
	for _, n := range []int{1, 300} {
		for _, s := range shapes {
			b.Run(fmt.Sprintf("cols=%d/%s", n, s.name), func(b *testing.B) { runShape(b, hostileCols(n), s.p) })
		}
	}
}

func BenchmarkCliffHostileRoot(b *testing.B) {
	const size = 1 << 20
	p := repeatTo(`{"x":0`, `,"zzzzzzzzzz":0`, `}`, size)
	q := repeatTo(`{"x":0`, `,"zzzzzzzzz":0`, `}`, size) // one byte shorter: lengths differ
	for _, n := range []int{2, 300} {
		b.Run(fmt.Sprintf("cols=%d/samelen", n), func(b *testing.B) { runShape(b, wideCols(n), p) })
		b.Run(fmt.Sprintf("cols=%d/difflen", n), func(b *testing.B) { runShape(b, wideCols(n), q) })
	}
}

func runRefuse(b *testing.B, cols []Column, payload []byte) {
	b.Helper()
	enc := mustCompile(b, cols...).NewEncoder(2 << 20)
	ev := &Event{Data: payload, Subject: "events.x"}
	buf := make([]byte, 0, 4<<20)
	_, err := enc.AppendTuple(buf[:0], ev)
	if err == nil {
		b.Fatal("accepted")
	}
	b.Logf("%.200s", err)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		enc.AppendTuple(buf[:0], ev)
	}
}

func BenchmarkCliffRefuse(b *testing.B) {
	const size = 1 << 20
	id := `{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab"`
	for _, s := range []struct {
		name string
		p    []byte
	}{
		{"valid-then-junk", repeatTo(id+`,"b":[0`, `,0`, `]}x`, size)},
		{"array-unclosed", repeatTo(id+`,"b":[0`, `,0`, `}`, size)},
		{"deep299-unclosed", repeatTo(id+`,"b":`+strings.Repeat("[", 298)+`0`, `,0`, ``, size)},
		{"deep299-objects-unclosed", repeatTo(id+`,"b":`+strings.Repeat(`{"a":`, 298)+`{"a":0`, `,"a":0`, ``, size)},
		{"badnum-end", repeatTo(id+`,"b":[0`, `,0`, `,01]}`, size)},
		{"string-unclosed", repeatTo(id+`,"b":"`, `abcdefgh`, ``, size)},
	} {
		b.Run(s.name, func(b *testing.B) { runRefuse(b, threeCols[:1], s.p) })
	}
}

func BenchmarkCliffHostileScale(b *testing.B) {
	const size = 1 << 20
	id := `{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab"`
	for _, n := range []int{8, 50, 1599} {
		b.Run(fmt.Sprintf("cols=%d/array-under-a", n), func(b *testing.B) { runShape(b, hostileCols(n), repeatTo(id+`,"a":[0`, `,0`, `]}`, size)) })
		b.Run(fmt.Sprintf("cols=%d/dupkey-a-scalar", n), func(b *testing.B) { runShape(b, hostileCols(n), repeatTo(id, `,"a":0`, `}`, size)) })
	}
}

// worker.encode of large events with a jsonb payload column: the tuple
// leaves the slab above 8 KiB.
func BenchmarkCliffWorkerEncode(b *testing.B) {
	cols := append(threeCols[:3:3], Column{Name: "body", From: "payload", Type: TypeJSONB})
	m := mustCompile(b, cols...)
	for _, size := range []int{180, 4 << 10, 16 << 10, 200 << 10, 300 << 10, 1 << 20} {
		ev := &Event{Data: padded(max(size, 200), false)}
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.SetBytes(int64(len(ev.Data)))
			encodeReleasing(b, m, ev, 64)
		})
	}
}

// Array index paths: items.0.id .. items.(n-1).id over an n-element array.
func BenchmarkCliffIndexPaths(b *testing.B) {
	for _, n := range []int{10, 100, 300} {
		var sb strings.Builder
		sb.WriteString(`{"items":[`)
		cols := []Column{}
		for i := 0; i < n; i++ {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"id":%d,"x":"y"}`, i)
			cols = append(cols, Column{Name: fmt.Sprintf("c%d", i), From: fmt.Sprintf("json:items.%d.id", i), Type: TypeInt8})
		}
		sb.WriteString(`]}`)
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { runShape(b, cols, []byte(sb.String())) })
	}
}
