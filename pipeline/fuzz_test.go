package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzColumns reads one key per type, so a fuzzed payload reaches every
// encoder, plus the payload itself as jsonb.
var fuzzColumns = []Column{
	{Name: "text", From: "json:t", Type: TypeText},
	{Name: "uuid", From: "json:u", Type: TypeUUID},
	{Name: "int2", From: "json:i2", Type: TypeInt2},
	{Name: "int4", From: "json:i4", Type: TypeInt4},
	{Name: "int8", From: "json:i8", Type: TypeInt8},
	{Name: "float4", From: "json:f4", Type: TypeFloat4},
	{Name: "float8", From: "json:f8", Type: TypeFloat8},
	{Name: "numeric", From: "json:n", Type: TypeNumeric},
	{Name: "bool", From: "json:b", Type: TypeBool},
	{Name: "ts", From: "json:ts", Type: TypeTimestamptz},
	{Name: "date", From: "json:d", Type: TypeDate},
	{Name: "jsonb", From: "/o/0", Type: TypeJSONB},
	{Name: "bytea", From: "json:y", Type: TypeBytea},
	{Name: "textobj", From: "json:o", Type: TypeText},
	{Name: "hdr", From: "header:H", Type: TypeJSONB},
	{Name: "body", From: "payload", Type: TypeJSONB},
}

// FuzzAppendTuple feeds arbitrary payloads and header values to the
// encoder: it must not panic, must leave dst alone on error, and on success
// must produce a well-formed tuple with one field per column.
func FuzzAppendTuple(f *testing.F) {
	f.Add([]byte(benchPayload), `{"h":1}`)
	f.Add([]byte(`{"t":"x","u":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","i2":1,"i4":"2","i8":-3,"f4":0.5,"f8":1e3,"n":"-1.50e2","b":true,"ts":"2026-11-29T19:59:15.1234567+01:00","d":"2024-02-29","o":[{"a":"\u00e9"},2],"y":"AAE="}`), `[]`)
	f.Add([]byte(`{"t":"\u0000","o":[{"\ud83d\ude00":null}]}`), `"\u0000"`)
	f.Add([]byte(`{"n":1e99999,"i8":9223372036854775808,"ts":"9999-12-31T23:59:59.9999999Z"}`), ``)
	enc := mustCompile(f, fuzzColumns...).NewEncoder(1 << 16)
	f.Fuzz(func(t *testing.T, payload []byte, header string) {
		ev := &Event{Data: payload, Header: map[string][]string{"H": {header}}}
		prefix := []byte("pre")
		out, err := enc.AppendTuple(prefix, ev)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Code == "" {
				t.Fatalf("error is not a *DecodeError with a code: %v", err)
			}
			if !bytes.Equal(out, prefix) {
				t.Fatalf("dst changed on error")
			}
			return
		}
		if !bytes.HasPrefix(out, prefix) {
			t.Fatalf("prefix lost")
		}
		if f := fields(t, out[len(prefix):]); len(f) != len(fuzzColumns) {
			t.Fatalf("%d fields, want %d", len(f), len(fuzzColumns))
		}
	})
}

// decodeNumeric turns numeric's binary format back into an exact rational
// and its display scale.
func decodeNumeric(t *testing.T, b []byte) (*big.Rat, int) {
	t.Helper()
	nd := int(binary.BigEndian.Uint16(b))
	weight := int(int16(binary.BigEndian.Uint16(b[2:])))
	sign := binary.BigEndian.Uint16(b[4:])
	dscale := int(binary.BigEndian.Uint16(b[6:]))
	if len(b) != 8+2*nd {
		t.Fatalf("numeric of %d bytes has %d digits", len(b), nd)
	}
	var sb strings.Builder
	sb.WriteString("0")
	for i := range nd {
		d := binary.BigEndian.Uint16(b[8+2*i:])
		if d > 9999 {
			t.Fatalf("digit %d out of range", d)
		}
		if (i == 0 || i == nd-1) && d == 0 {
			t.Fatalf("leading or trailing zero digit")
		}
		sb.WriteString(strconv.Itoa(int(d) + 10000)[1:])
	}
	r, ok := new(big.Rat).SetString(sb.String() + "e" + strconv.Itoa(4*(weight-nd+1)))
	if !ok {
		t.Fatalf("rebuild %q", sb.String())
	}
	if sign == numericNegSign {
		r.Neg(r)
	} else if sign != numericPosSign {
		t.Fatalf("sign %x", sign)
	}
	return r, dscale
}

// FuzzNumeric checks that the numeric encoding is exact: decoding it gives
// the value the text denotes, with the scale the text shows.
func FuzzNumeric(f *testing.F) {
	for _, s := range []string{"0", "-0.00", "1", "12345.6789", "-0.000123", "1e8", "15e-5", "9999.9999e4", "00012.50", "1E+3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !isJSONNumber(s) || len(s) > 200 {
			return
		}
		b, derr := appendNumeric(nil, s)
		if derr != nil {
			if derr.Code != CodeOutOfRange {
				t.Fatalf("%q: %v", s, derr)
			}
			return
		}
		got, dscale := decodeNumeric(t, b)
		want, ok := new(big.Rat).SetString(s)
		if !ok {
			return // big.Rat refuses exponents it finds too large
		}
		if got.Cmp(want) != 0 {
			t.Fatalf("%q encodes %s", s, got.FloatString(20))
		}
		mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
		_, frac, _ := strings.Cut(mant, ".")
		e, _ := strconv.Atoi(exp)
		if wantScale := max(len(frac)-e, 0); dscale != wantScale {
			t.Fatalf("%q: dscale %d, want %d", s, dscale, wantScale)
		}
	})
}

// FuzzTimestamp compares parseTimestamp with time.Parse where both accept.
func FuzzTimestamp(f *testing.F) {
	for _, s := range []string{"2026-11-29T19:59:15.123456Z", "2000-01-01T00:00:00+14:00", "1999-12-31t23:59:59.9999995z", "0001-01-01T00:00:00-00:30"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		us, derr := parseTimestamp(s)
		tm, err := time.Parse(time.RFC3339Nano, s)
		if derr != nil || err != nil {
			return
		}
		want := tm.Round(time.Microsecond).UnixMicro() - pgEpochMicros
		if us != want {
			t.Fatalf("%q: %d µs, time.Parse says %d", s, us, want)
		}
	})
}
