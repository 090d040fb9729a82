package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"
)

func TestCompileRejects(t *testing.T) {
	ok := Column{Name: "a", From: "json:a", Type: TypeText}
	cases := []struct {
		name string
		cols []Column
		want string // part of the message
	}{
		{"no columns", nil, "no columns"},
		{"empty name", []Column{{From: "payload", Type: TypeJSONB}}, "name is empty"},
		{"duplicate", []Column{ok, ok}, "already used by column 0"},
		{"long name", []Column{{Name: strings.Repeat("é", 32), From: "payload", Type: TypeJSONB}}, "name is 64 bytes; PostgreSQL cuts names to 63"},
		{"bad type", []Column{{Name: "a", From: "json:a", Type: "varchar"}}, `unknown type "varchar"`},
		{"empty from", []Column{{Name: "a", Type: TypeText}}, "source is empty"},
		{"unknown from", []Column{{Name: "a", From: "body", Type: TypeText}}, `unknown source "body"`},
		{"bad meta", []Column{{Name: "a", From: "meta:seq", Type: TypeInt8}}, "meta: takes one of"},
		{"empty header", []Column{{Name: "a", From: "header:", Type: TypeText}}, "names no header"},
		{"header with a space", []Column{{Name: "a", From: "header: X-Id", Type: TypeText}}, "a header name has no white space"},
		{"header with a colon", []Column{{Name: "a", From: "header:X:Y", Type: TypeText}}, "a header name has no white space, ':'"},
		{"empty json", []Column{{Name: "a", From: "json:", Type: TypeText}}, "empty path"},
		{"empty key", []Column{{Name: "a", From: "json:a..b", Type: TypeText}}, "empty key"},
		{"bad pointer", []Column{{Name: "a", From: "/a~2", Type: TypeText}}, "bad escape"},
		{"seq as int4", []Column{{Name: "a", From: "meta:stream_seq", Type: TypeInt4}}, "use one of int8, numeric, text"},
		{"payload as uuid", []Column{{Name: "a", From: "payload", Type: TypeUUID}}, "use one of jsonb, bytea, text"},
		{"time as int8", []Column{{Name: "a", From: "meta:published_at", Type: TypeInt8}}, "use one of timestamptz, text"},
		{"subject as jsonb", []Column{{Name: "a", From: "meta:subject", Type: TypeJSONB}}, "cannot fill a column of type jsonb"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Compile(c.cols)
			if !errors.Is(err, ErrInvalidMapping) || m != nil {
				t.Fatalf("Compile = %v, %v; want ErrInvalidMapping", m, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q lacks %q", err, c.want)
			}
			if len(c.cols) > 0 && !strings.Contains(err.Error(), "column ") {
				t.Fatalf("error %q names no column", err)
			}
		})
	}
}

// Every column at fault is reported, each with its index: one attempt
// shows them all.
func TestCompileReportsEveryColumn(t *testing.T) {
	ok := Column{Name: "a", From: "json:a", Type: TypeText}
	_, err := Compile([]Column{
		{Name: "x", From: "json:x", Type: "varchar"},
		ok,
		{Name: "a", From: "json:b", Type: TypeText},
		{Name: "c", From: "meta:seq", Type: TypeInt8},
	})
	var parts []error
	if j, isJoin := err.(interface{ Unwrap() []error }); isJoin {
		parts = j.Unwrap()
	}
	want := []string{`column 0 ("x"): unknown type "varchar"`, `column 2 ("a"): name is already used by column 1`, `column 3 ("c"): unknown source "meta:seq"`}
	if len(parts) != len(want) {
		t.Fatalf("Compile = %v; want %d joined problems", err, len(want))
	}
	for i, p := range parts {
		if !errors.Is(p, ErrInvalidMapping) || !strings.Contains(p.Error(), want[i]) {
			t.Errorf("problem %d = %q, want ErrInvalidMapping and %q", i, p, want[i])
		}
		var ce *ColumnError
		if !errors.As(p, &ce) || ce.Index != []int{0, 2, 3}[i] {
			t.Errorf("problem %d = %#v, want a *ColumnError for column %d", i, p, []int{0, 2, 3}[i])
		}
	}
}

func TestCompilePaths(t *testing.T) {
	cases := []struct {
		from string
		path []string
	}{
		{"json:a", []string{"a"}},
		{"json:tags.site", []string{"tags", "site"}},
		{"json:items.0.id", []string{"items", "0", "id"}},
		{"/a/b", []string{"a", "b"}},
		{"/a.b/c~1d/e~0f/~01", []string{"a.b", "c/d", "e~f", "~1"}},
		{"/", []string{""}},
		{"json:/tags/site", []string{"tags", "site"}}, // DESIGN.md: json:<dotted.path> or a pointer
		{"json:/a.b/c~1d", []string{"a.b", "c/d"}},
	}
	for _, c := range cases {
		m := mustCompile(t, Column{Name: "x", From: c.from, Type: TypeText})
		if got := m.cols[0].path; strings.Join(got, "\x00") != strings.Join(c.path, "\x00") {
			t.Errorf("%s: path %q, want %q", c.from, got, c.path)
		}
	}
}

func TestRawColumns(t *testing.T) {
	m := mustCompile(t, RawColumns()...)
	ts := time.Date(2026, 11, 29, 19, 59, 15, 123456789, time.UTC)
	ev := &Event{Stream: "EVENTS", StreamSeq: 42, Subject: "events.a", Published: ts, Received: ts.Add(time.Millisecond),
		MsgID: "m-1", Data: []byte(`{"a":1}`)}
	tup, err := m.NewEncoder(0).AppendTuple(nil, ev)
	if err != nil {
		t.Fatal(err)
	}
	f := fields(t, tup)
	want := [][]byte{[]byte("EVENTS"), be64(42), []byte("events.a"), tsMicros("2026-11-29T19:59:15.123457Z"),
		tsMicros("2026-11-29T19:59:15.124457Z"), []byte("m-1"), []byte("\x01{\"a\":1}")}
	for i := range want {
		if !bytes.Equal(f[i], want[i]) {
			t.Errorf("field %d (%s) = %x, want %x", i, RawColumns()[i].Name, f[i], want[i])
		}
	}
	cols := m.Columns()
	cols[0].Name = "changed"
	if m.Columns()[0].Name != "stream" {
		t.Error("Columns returned the Mapper's own slice")
	}
}

func TestMetaHeaderPayload(t *testing.T) {
	ts := time.Date(2026, 11, 29, 19, 59, 15, 500, time.FixedZone("x", 3600))
	ev := &Event{
		Stream: "S", StreamSeq: 1<<63 + 1, ConsumerSeq: 7, Delivered: 3, Subject: "s.1", Published: ts,
		MsgID:  "3f0c9a2e-1b7d-4c8e-9f00-0123456789ab",
		Header: map[string][]string{"X-Count": {"12", "13"}, "X-Bad": {"a\x00"}, "X-JSON": {`{"k":[1]}`}, "X-Ctl": {"\"\x01\\\\n\""}, "X-Time": {"2026-11-29T19:59:15Z"}, "X-Empty": {""}},
		Data:   []byte("not json \xff"),
	}
	cases := []struct {
		from string
		typ  Type
		want []byte
		code string
	}{
		{"meta:stream", TypeText, []byte("S"), ""},
		{"meta:stream_seq", TypeInt8, nil, CodeOutOfRange},
		{"meta:stream_seq", TypeText, []byte("9223372036854775809"), ""},
		{"meta:stream_seq", TypeNumeric, numericBytes(4, 0, 0, 922, 3372, 368, 5477, 5809), ""},
		{"meta:consumer_seq", TypeInt8, be64(7), ""},
		{"meta:delivered", TypeInt2, be16(3), ""},
		{"meta:delivered", TypeInt4, be32(3), ""},
		{"meta:subject", TypeText, []byte("s.1"), ""},
		{"meta:published_at", TypeTimestamptz, tsMicros("2026-11-29T18:59:15.000001Z"), ""}, // rounded, a half away from zero
		{"meta:published_at", TypeText, []byte("2026-11-29T18:59:15.0000005Z"), ""},
		{"meta:received_at", TypeTimestamptz, nil, ""}, // zero time: NULL
		{"meta:msg_id", TypeUUID, hx("3f0c9a2e1b7d4c8e9f000123456789ab"), ""},
		{"header:X-Count", TypeInt4, be32(12), ""},
		{"header:X-Count", TypeText, []byte("12"), ""},
		{"header:x-count", TypeText, nil, ""},                // header names are case-sensitive, as in nats.Header
		{"header:X-Empty", TypeText, []byte{}, ""},           // there, empty: not NULL
		{"header:X-Empty", TypeUUID, nil, CodeInvalidFormat}, // nor NULL for a typed column
		{"header:X-Empty", TypeInt4, nil, CodeInvalidFormat},
		{"header:X-Bad", TypeText, nil, CodeNULInText},
		{"header:X-JSON", TypeJSONB, []byte("\x01{\"k\":[1]}"), ""},
		{"header:X-Ctl", TypeJSONB, nil, CodeInvalidJSON}, // fastjson.Validate alone let this through
		{"header:X-Count", TypeBytea, []byte("12"), ""},
		{"header:X-Time", TypeTimestamptz, tsMicros("2026-11-29T19:59:15Z"), ""},
		{"header:X-Time", TypeJSONB, nil, CodeInvalidJSON},
		{"payload", TypeBytea, []byte("not json \xff"), ""},
		{"payload", TypeText, nil, CodeInvalidUTF8},
		{"payload", TypeJSONB, nil, CodeInvalidUTF8},
	}
	// The same event with its headers read from the message (consumer/wire).
	raw := *ev
	raw.Msg, raw.Header = rawHeaders(ev.Header), nil
	for _, c := range cases {
		evs := []*Event{ev}
		if strings.HasPrefix(c.from, "header:") {
			evs = append(evs, &raw)
		}
		for _, ev := range evs {
			t.Run(c.from+"/"+string(c.typ)+fmt.Sprintf("/raw=%v", ev.Header == nil), func(t *testing.T) {
				m := mustCompile(t, Column{Name: "v", From: c.from, Type: c.typ})
				tup, err := m.NewEncoder(0).AppendTuple(nil, ev)
				if c.code != "" {
					var de *DecodeError
					wantCol := "v"
					if c.from == "payload" && c.typ == TypeJSONB {
						wantCol = "" // the payload as a whole is not JSON
					}
					if !errors.As(err, &de) || de.Code != c.code || de.Column != wantCol {
						t.Fatalf("err = %v, want code %s on column v", err, c.code)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				f := fields(t, tup)
				if (c.want == nil) != (f[0] == nil) || !bytes.Equal(f[0], c.want) {
					t.Fatalf("field = %x (%q), want %x", f[0], f[0], c.want)
				}
			})
		}
	}
}

// rawHeaders is a Msg whose headers are read through RawHeader, as
// consumer/wire's are.
type rawHeaders map[string][]string

func (h rawHeaders) HeaderGet(key string) string {
	v, _ := h.HeaderLookup(key)
	return v
}

func (h rawHeaders) HeaderLookup(key string) (string, bool) {
	if v := h[key]; len(v) > 0 {
		return v[0], true
	}
	return "", false
}

func (h rawHeaders) HeaderFold(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

func (h rawHeaders) HeaderFields() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for k, vs := range h {
			for _, v := range vs {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

func (rawHeaders) Ack() error                       { return nil }
func (rawHeaders) Nak() error                       { return nil }
func (rawHeaders) NakWithDelay(time.Duration) error { return nil }
func (rawHeaders) InProgress() error                { return nil }
func (rawHeaders) Term() error                      { return nil }
func (rawHeaders) TermWithReason(string) error      { return nil }

func TestPayloadJSONChecks(t *testing.T) {
	m := mustCompile(t, Column{Name: "b", From: "payload", Type: TypeJSONB})
	cases := []struct {
		payload string
		code    string
	}{
		{`{"a":1}`, ""},
		{` [1, 2] `, ""},
		{`{"a":"\\u0000"}`, ""}, // an escaped backslash, then text: no NUL
		{`{"a":"\u0000"}`, CodeNULInText},
		{`{"a":"\ud800x"}`, CodeInvalidJSON},
		{`{"a":"\udc00"}`, CodeInvalidJSON},
		{`{"a":NaN}`, CodeInvalidJSON},
		{`{"a":01}`, CodeInvalidJSON},
		{"{\"a\":\"\x01\"}", CodeInvalidJSON},
		{"{\"a\":\"\x01\\\\n\"}", CodeInvalidJSON}, // fastjson.Validate alone let this through
		{`{"a":1}x`, CodeInvalidJSON},
		{``, CodeInvalidJSON},
		{"{\"a\":\"\xc3\x28\"}", CodeInvalidUTF8},
		{strings.Repeat("[", 400) + strings.Repeat("]", 400), CodeInvalidJSON},
		{`{"a":[1e131071, -1e-16383, 2E+3]}`, ""},
		{`{"a":[1e131072]}`, CodeOutOfRange},
		{`{"a":{"b":-1e-16384}}`, CodeOutOfRange},
		{`{"a":"1e999999"}`, ""}, // a string, not a number
		{`{"a":1` + strings.Repeat("0", 131072) + `}`, CodeOutOfRange},
	}
	for _, c := range cases {
		_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(c.payload)})
		var de *DecodeError
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%q: %v", c.payload, err)
		case c.code != "" && (!errors.As(err, &de) || de.Code != c.code):
			t.Errorf("%q: err = %v, want %s", c.payload, err, c.code)
		case c.code != "" && de.Column != "" && c.code != CodeNULInText && c.code != CodeOutOfRange:
			t.Errorf("%q: whole-payload error names column %q", c.payload, de.Column)
		}
	}
}

func TestDecodeErrorDeadLetter(t *testing.T) {
	de := &DecodeError{Column: "id", Code: CodeRequiredMissing, Reason: "missing"}
	dl := de.DeadLetter()
	if dl.Stage != StageDecode || dl.Code != CodeRequiredMissing || !strings.Contains(dl.Reason, `"id"`) {
		t.Fatalf("%+v", dl)
	}
}

func TestAppendTupleAllocs(t *testing.T) {
	enc := mustCompile(t, benchColumns...).NewEncoder(1 << 20)
	ev := &Event{Data: benchPayload}
	buf := make([]byte, 0, 1024)
	if a := testing.AllocsPerRun(200, func() {
		var err error
		if buf, err = enc.AppendTuple(buf[:0], ev); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("AppendTuple allocates %v times per event", a)
	}
}

// TestEveryTypeAllocs checks that every encoder, not only the benchmark's,
// is allocation-free on the success path.
func TestEveryTypeAllocs(t *testing.T) {
	cols := append([]Column{
		{Name: "seqnum", From: "meta:stream_seq", Type: TypeNumeric},
		{Name: "seqtext", From: "meta:stream_seq", Type: TypeText},
		{Name: "pubtext", From: "meta:published_at", Type: TypeText},
		{Name: "pub", From: "meta:published_at", Type: TypeTimestamptz},
		{Name: "hint", From: "header:N", Type: TypeInt8},
		{Name: "hjson", From: "header:J", Type: TypeJSONB},
		{Name: "numtext", From: "json:f8", Type: TypeText},
		{Name: "numjson", From: "json:f8", Type: TypeJSONB},
		{Name: "strjson", From: "json:t", Type: TypeJSONB},
	}, fuzzColumns...)
	enc := mustCompile(t, cols...).NewEncoder(0)
	ev := &Event{
		StreamSeq: 123456789, Published: time.Now(),
		Header: map[string][]string{"N": {"42"}, "J": {`{"a":[1,2]}`}, "H": {`"x"`}},
		Data: []byte(`{"t":"x\ty","u":"3F0C9A2E-1B7D-4C8E-9F00-0123456789AB","i2":-32768,"i4":"2147483647",` +
			`"i8":-9223372036854775808,"f4":3.4e38,"f8":-0.5,"n":"-1.50e-2","b":"false","ts":"2000-01-01T00:00:00.1234567-02:00",` +
			`"d":"2000-02-29","o":[{"k":["\u00e9",{"z":null}]},true],"y":"AAEC/w=="}`),
	}
	buf := make([]byte, 0, 4096)
	if _, err := enc.AppendTuple(buf, ev); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() {
		if _, err := enc.AppendTuple(buf[:0], ev); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("AppendTuple allocates %v times per event", a)
	}
}
