package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestKVDeleteMarkers: a NATS KV bucket's delete and purge markers (an
// empty body with KV-Operation: DEL or PURGE, as nats.go's kv Delete and
// Purge publish them) read as JSON null where a mapping reads JSON, so a
// changelog table records them; any other empty body stays invalid JSON.
func TestKVDeleteMarkers(t *testing.T) {
	del := map[string][]string{"KV-Operation": {"DEL"}}
	purge := map[string][]string{"KV-Operation": {"PURGE"}, "Nats-Rollup": {"sub"}, "Nats-TTL": {"1h"}}

	// A changelog of a bucket: the key, the operation, the revision and the value.
	changelog := mustCompile(t,
		Column{Name: "key", From: "meta:subject", Type: TypeText, Required: true},
		Column{Name: "op", From: "header:KV-Operation", Type: TypeText},
		Column{Name: "rev", From: "meta:stream_seq", Type: TypeInt8, Required: true},
		Column{Name: "name", From: "json:name", Type: TypeText},
		Column{Name: "n", From: "json:n", Type: TypeInt8},
		Column{Name: "value", From: "payload", Type: TypeJSONB},
		Column{Name: "body", From: "payload", Type: TypeText},
	)
	for _, h := range []map[string][]string{del, purge} {
		for _, headers := range []string{"map", "raw"} {
			t.Run(h["KV-Operation"][0]+"/"+headers, func(t *testing.T) {
				ev := &Event{Subject: "$KV.b.k1", StreamSeq: 7, Header: h}
				if headers == "raw" { // read through the message, as consumer/wire's are
					ev.Msg, ev.Header = rawHeaders(h), nil
				}
				tup, err := changelog.NewEncoder(0).AppendTuple(nil, ev)
				if err != nil {
					t.Fatal(err)
				}
				want := [][]byte{[]byte("$KV.b.k1"), []byte(h["KV-Operation"][0]), be64(7), null, null, null, {}}
				f := fields(t, tup)
				for i := range want {
					if (want[i] == nil) != (f[i] == nil) || !bytes.Equal(f[i], want[i]) {
						t.Errorf("field %d (%s) = %x (%q), want %x", i, changelog.Columns()[i].Name, f[i], f[i], want[i])
					}
				}
			})
		}
	}

	// A non-empty body with the header is decoded as any other.
	t.Run("body", func(t *testing.T) {
		ev := &Event{Subject: "$KV.b.k1", StreamSeq: 8, Header: del, Data: []byte(`{"name":"x","n":2}`)}
		tup, err := changelog.NewEncoder(0).AppendTuple(nil, ev)
		if err != nil {
			t.Fatal(err)
		}
		f := fields(t, tup)
		if string(f[3]) != "x" || !bytes.Equal(f[4], be64(2)) || string(f[5]) != "\x01"+`{"name":"x","n":2}` {
			t.Errorf("fields = %q", f)
		}
		ev.Data = []byte(" ")
		if _, err := changelog.NewEncoder(0).AppendTuple(nil, ev); !isCode(err, CodeInvalidJSON) {
			t.Errorf("white space alone with KV-Operation: DEL: err = %v, want invalid_json", err)
		}
	})

	// One encoder, as a worker keeps it: a marker after an event that set
	// every json: column finds none of them, and the next event its own.
	t.Run("one encoder", func(t *testing.T) {
		enc := changelog.NewEncoder(0)
		full := &Event{Subject: "$KV.b.k1", StreamSeq: 8, Data: []byte(`{"name":"x","n":2}`)}
		marker := &Event{Subject: "$KV.b.k1", StreamSeq: 9, Header: del}
		for i, ev := range []*Event{full, marker, full, marker} {
			tup, err := enc.AppendTuple(nil, ev)
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			f := fields(t, tup)
			if ev == marker && (f[3] != nil || f[4] != nil || f[5] != nil || f[6] == nil || len(f[6]) != 0) {
				t.Errorf("marker after an event (%d): fields = %q, want name, n and value NULL, body empty", i, f)
			}
			if ev == full && (string(f[3]) != "x" || !bytes.Equal(f[4], be64(2))) {
				t.Errorf("event after a marker (%d): fields = %q", i, f)
			}
		}
	})

	// Raw mode: the payload column is required (and NOT NULL in the table
	// init makes), so the marker is refused before the database, and the
	// reason says what it was.
	t.Run("raw mode", func(t *testing.T) {
		raw := mustCompile(t, RawColumns()...)
		_, err := raw.NewEncoder(0).AppendTuple(nil, &Event{Stream: "KV_b", StreamSeq: 7, Subject: "$KV.b.k1", Header: purge})
		var de *DecodeError
		if !errors.As(err, &de) || de.Code != CodeRequiredMissing || de.Column != "payload" ||
			!strings.HasSuffix(de.Reason, "; the event is a KV PURGE marker (header KV-Operation: PURGE, no body)") {
			t.Fatalf("err = %#v, want required_missing on payload naming the marker", err)
		}
		// Not required: SQL NULL, not jsonb 'null'.
		cols := RawColumns()
		cols[len(cols)-1].Required = false
		tup, err := mustCompile(t, cols...).NewEncoder(0).AppendTuple(nil, &Event{Stream: "KV_b", StreamSeq: 7, Subject: "$KV.b.k1", Header: del})
		if err != nil {
			t.Fatal(err)
		}
		if f := fields(t, tup); f[len(f)-1] != nil {
			t.Errorf("payload = %q, want NULL", f[len(f)-1])
		}
	})

	t.Run("required", func(t *testing.T) {
		m := mustCompile(t,
			Column{Name: "op", From: "header:KV-Operation", Type: TypeText},
			Column{Name: "id", From: "json:id", Type: TypeUUID, Required: true},
		)
		_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Header: del})
		var de *DecodeError
		if !errors.As(err, &de) || de.Code != CodeRequiredMissing || de.Column != "id" ||
			de.Reason != "value of json:id is missing or null and the column is required; the event is a KV DEL marker (header KV-Operation: DEL, no body)" {
			t.Fatalf("err = %#v, want required_missing on id", err)
		}
	})

	// Without a JSON column nothing changes: the payload's bytes, empty.
	t.Run("no JSON", func(t *testing.T) {
		m := mustCompile(t, Column{Name: "body", From: "payload", Type: TypeBytea})
		tup, err := m.NewEncoder(0).AppendTuple(nil, &Event{Header: del})
		if err != nil {
			t.Fatal(err)
		}
		if f := fields(t, tup); f[0] == nil || len(f[0]) != 0 {
			t.Errorf("body = %q, want empty, not NULL", f[0])
		}
	})

	// Any other empty body is refused as it always was: without the
	// header (also nats.go's kv Put of an empty value, which sends none),
	// with PUT or another value, the name or value in another case, or
	// DEL as the second value only.
	_, plain := changelog.NewEncoder(0).AppendTuple(nil, &Event{})
	if !isCode(plain, CodeInvalidJSON) || !strings.HasSuffix(plain.Error(), "payload is not valid JSON: cannot parse empty string at byte 0") {
		t.Fatalf("empty body: err = %v, want invalid_json", plain)
	}
	for _, h := range []map[string][]string{
		nil,
		{"Nats-Rollup": {"sub"}},
		{"KV-Operation": {"PUT"}},
		{"KV-Operation": {""}},
		{"KV-Operation": {"del"}},
		{"kv-operation": {"DEL"}},
		{"KV-Operation": {"PUT", "DEL"}},
		{"KV-Operation": {"DELETE"}},
	} {
		for name, m := range map[string]*Mapper{"changelog": changelog, "raw mode": mustCompile(t, RawColumns()...)} {
			t.Run(fmt.Sprintf("%v/%s", h, name), func(t *testing.T) {
				_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Header: h})
				if err == nil || err.Error() != plain.Error() {
					t.Errorf("err = %v, want %v", err, plain)
				}
			})
		}
	}
}

func isCode(err error, code string) bool {
	var de *DecodeError
	return errors.As(err, &de) && de.Code == code
}

// A jsonb payload column that is not required may be NULL (a KV marker's),
// which check needs to know of a NOT NULL column; a text or bytea one
// stores the marker's empty body, and a required one refuses it.
func TestPayloadMayBeNull(t *testing.T) {
	for _, c := range []struct {
		col  Column
		null bool
	}{
		{Column{From: "payload", Type: TypeJSONB}, true},
		{Column{From: "payload", Type: TypeJSONB, Required: true}, false},
		{Column{From: "payload", Type: TypeText}, false},
		{Column{From: "payload", Type: TypeBytea}, false},
		{Column{From: "meta:subject", Type: TypeText}, false},
		{Column{From: "json:a", Type: TypeJSONB}, true},
	} {
		if got := c.col.MayBeNull(); got != c.null {
			t.Errorf("%+v: MayBeNull() = %v, want %v", c.col, got, c.null)
		}
	}
}
