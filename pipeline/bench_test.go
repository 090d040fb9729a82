package pipeline

import (
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// benchPayload is a realistic telemetry event (~180 bytes).
var benchPayload = []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","ts":"2026-11-29T19:59:15.123456Z","device":"dev-0042","kind":"temperature","value":21.375,"seq":123456,"tags":{"site":"ams-3","rack":"r12"}}`)

// benchColumns maps benchPayload to 8 columns.
var benchColumns = []Column{
	{Name: "id", From: "json:id", Type: TypeUUID, Required: true},
	{Name: "ts", From: "json:ts", Type: TypeTimestamptz},
	{Name: "device", From: "json:device", Type: TypeText},
	{Name: "kind", From: "json:kind", Type: TypeText},
	{Name: "value", From: "json:value", Type: TypeFloat8},
	{Name: "seq", From: "json:seq", Type: TypeInt8},
	{Name: "site", From: "json:tags.site", Type: TypeText},
	{Name: "body", From: "payload", Type: TypeJSONB},
}

// BenchmarkAppendTuple is the hot path as the workers run it.
func BenchmarkAppendTuple(b *testing.B) {
	enc := mustCompile(b, benchColumns...).NewEncoder(1 << 20)
	ev := &Event{Data: benchPayload, Subject: "events.dev-0042"}
	buf := make([]byte, 0, 1024)
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = enc.AppendTuple(buf[:0], ev)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// telemetry holds the extracted fields for the library comparison.
type telemetry struct {
	ID     string  `json:"id"`
	TS     string  `json:"ts"`
	Device string  `json:"device"`
	Kind   string  `json:"kind"`
	Value  float64 `json:"value"`
	Seq    int64   `json:"seq"`
	Tags   struct {
		Site string `json:"site"`
	} `json:"tags"`
}

// encodeTelemetry writes the same 8-column tuple AppendTuple writes, from
// fields another JSON library extracted, so the comparison measures the
// JSON library and nothing else.
func encodeTelemetry(b *testing.B, dst []byte, t *telemetry, payload []byte) []byte {
	field := func(dst []byte, f func([]byte) ([]byte, *DecodeError)) []byte {
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		dst, derr := f(dst)
		if derr != nil {
			b.Fatal(derr)
		}
		binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
		return dst
	}
	dst = binary.BigEndian.AppendUint16(dst, 8)
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return appendUUID(d, t.ID) })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return appendString(d, TypeTimestamptz, t.TS, true) })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return appendString(d, TypeText, t.Device, true) })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return appendString(d, TypeText, t.Kind, true) })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) {
		return binary.BigEndian.AppendUint64(d, math.Float64bits(t.Value)), nil
	})
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return binary.BigEndian.AppendUint64(d, uint64(t.Seq)), nil })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return appendString(d, TypeText, t.Tags.Site, true) })
	dst = field(dst, func(d []byte) ([]byte, *DecodeError) { return append(append(d, 1), payload...), nil })
	return dst
}

// tupleAppender is what the encoder and the reference encoder have in common.
type tupleAppender interface {
	AppendTuple(dst []byte, ev *Event) ([]byte, error)
}

// benchAppend encodes benchPayload with enc b.N times.
func benchAppend(b *testing.B, enc tupleAppender) {
	ev := &Event{Data: benchPayload}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = enc.AppendTuple(buf[:0], ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSONLibraries compares the candidate JSON libraries on the same
// event and the same 8-column tuple, in one run. Each variant validates the
// payload (the jsonb column needs it) and extracts the seven fields.
// "scanner" and "fastjson" share the per-type encoders, so between them
// only the JSON handling differs.
func BenchmarkJSONLibraries(b *testing.B) {
	b.Run("scanner", func(b *testing.B) { // the real encoder: one pass, no tree
		benchAppend(b, mustCompile(b, benchColumns...).NewEncoder(0))
	})
	b.Run("fastjson", func(b *testing.B) { // the encoder before the scanner (ref_encoder_test.go)
		benchAppend(b, newRefEncoder(mustCompile(b, benchColumns...), 0))
	})
	b.Run("encoding_json_struct", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		b.ReportAllocs()
		for b.Loop() {
			var t telemetry
			if err := json.Unmarshal(benchPayload, &t); err != nil {
				b.Fatal(err)
			}
			buf = encodeTelemetry(b, buf[:0], &t, benchPayload)
		}
	})
	b.Run("encoding_json_map", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]any
			if err := json.Unmarshal(benchPayload, &m); err != nil {
				b.Fatal(err)
			}
			var t telemetry
			t.ID, _ = m["id"].(string)
			t.TS, _ = m["ts"].(string)
			t.Device, _ = m["device"].(string)
			t.Kind, _ = m["kind"].(string)
			t.Value, _ = m["value"].(float64)
			f, _ := m["seq"].(float64)
			t.Seq = int64(f)
			tags, _ := m["tags"].(map[string]any)
			t.Tags.Site, _ = tags["site"].(string)
			buf = encodeTelemetry(b, buf[:0], &t, benchPayload)
		}
	})
	b.Run("gjson", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		b.ReportAllocs()
		for b.Loop() {
			s := b2s(benchPayload)
			if !gjson.Valid(s) {
				b.Fatal("invalid")
			}
			var t telemetry
			t.ID = gjson.Get(s, "id").Str
			t.TS = gjson.Get(s, "ts").Str
			t.Device = gjson.Get(s, "device").Str
			t.Kind = gjson.Get(s, "kind").Str
			t.Value = gjson.Get(s, "value").Num
			t.Seq = gjson.Get(s, "seq").Int()
			t.Tags.Site = gjson.Get(s, "tags.site").Str
			buf = encodeTelemetry(b, buf[:0], &t, benchPayload)
		}
	})
}

// BenchmarkRowTuple compares how a worker gives each row its own tuple:
// carving from a slab that the sink releases in batches of 1,000 rows (what
// a drain does), from slabs never released (left to the GC), and one make
// per row.
func BenchmarkRowTuple(b *testing.B) {
	m := mustCompile(b, benchColumns...)
	ev := &Event{Data: benchPayload}
	b.Run("slab_released", func(b *testing.B) {
		encodeReleasing(b, m, ev, 1000)
	})
	b.Run("slab_dropped", func(b *testing.B) {
		w := &worker{enc: m.NewEncoder(0)}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := w.encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("make_per_row", func(b *testing.B) {
		enc := m.NewEncoder(0)
		var scratch []byte
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if scratch, err = enc.AppendTuple(scratch[:0], ev); err != nil {
				b.Fatal(err)
			}
			t := make([]byte, len(scratch))
			copy(t, scratch)
		}
	})
}

// BenchmarkKey compares Key with hash/fnv on the same subject.
func BenchmarkKey(b *testing.B) {
	ev := &Event{Subject: "events.telemetry.dev-0042"}
	b.Run("Key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Key(ev)
		}
	})
	b.Run("hash_fnv", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := fnv.New64a()
			h.Write([]byte(ev.Subject))
			_ = h.Sum64()
		}
	})
}

// BenchmarkParseTimestamp compares parseTimestamp with time.Parse on the
// form most payloads carry, and times parseDate; all take the value.
func BenchmarkParseTimestamp(b *testing.B) {
	const ts = "2026-11-29T19:59:15.123456Z"
	b.Run("parseTimestamp", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, derr := parseTimestamp(ts); derr != nil {
				b.Fatal(derr)
			}
		}
	})
	b.Run("time.Parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parseDate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := parseDate("2026-11-29"); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// encodeReleasing times a worker of m encoding ev, its rows released a
// batch of batch at a time, as the sink releases a committed batch's.
func encodeReleasing(b *testing.B, m *Mapper, ev *Event, batch int) {
	b.Helper()
	w := &worker{enc: m.NewEncoder(0)}
	defer w.retire()
	rows := make([]Row, 0, batch)
	b.ReportAllocs()
	for b.Loop() {
		row, err := w.encode(ev)
		if err != nil {
			b.Fatal(err)
		}
		rows = append(rows, row)
		if len(rows) == cap(rows) {
			ReleaseRows(rows)
			rows = rows[:0]
		}
	}
	ReleaseRows(rows)
}
