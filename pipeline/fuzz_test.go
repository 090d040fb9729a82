package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"os"
	"path/filepath"
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
	for _, s := range []string{"0", "-0.00", "1", "12345.6789", "-0.000123", "1e8", "15e-5", "9999.9999e4", "00012.50", "1E+3", "1.50e\t-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s, ok := pgNumberText(s, TypeNumeric)
		if !ok || len(s) > 200 {
			return
		}
		b, derr := appendNumeric(nil, s)
		// The reference reads no white space after the exponent marker.
		if mant, exp, ok := strings.Cut(strings.ToLower(s), "e"); ok {
			s = mant + "e" + strings.TrimLeft(exp, " \t\n\v\f\r")
		}
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
	for _, s := range []string{"2026-11-29T19:59:15.123456Z", "2000-01-01T00:00:00+14:00", "1999-12-31t23:59:59.9999995z", "0001-01-01T00:00:00-00:30",
		"2026-11-29 19:59:15.123+00", "2026-11-29T10:15Z", "2026-11-29T19:59:15.5+0530"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		us, derr := parseTimestamp(s)
		tm, err := time.Parse(time.RFC3339Nano, rfc3339(s))
		if derr != nil || err != nil {
			return
		}
		want := tm.Round(time.Microsecond).UnixMicro() - pgEpochMicros
		// Beyond microseconds the rounding is PostgreSQL's (ties to even in
		// binary; TestRoundTripPostgres checks it against the server), not
		// time.Round's, so the two may differ by one there.
		if d := us - want; d != 0 && (!finerThanMicros(s) || d < -1 || d > 1) {
			t.Fatalf("%q: %d µs, time.Parse says %d", s, us, want)
		}
	})
}

// rfc3339 rewrites the ISO 8601 forms parseTimestamp takes beside RFC 3339
// (a space for the T, no seconds, a ±HH or ±HHMM offset) as RFC 3339, for
// time.Parse to judge; anything else it leaves as it is.
func rfc3339(s string) string {
	if len(s) < 17 || s[13] != ':' {
		return s
	}
	b := []byte(s)
	if b[10] == ' ' {
		b[10] = 'T'
	}
	if b[16] != ':' { // no seconds (a fraction would need them: left to fail)
		b = append(b[:16:16], append([]byte(":00"), b[16:]...)...)
	}
	if i := bytes.LastIndexAny(b, "+-"); i >= 16 {
		switch z := b[i+1:]; {
		case len(z) == 2 && isDigits(z):
			b = append(b, ":00"...)
		case len(z) == 4 && isDigits(z):
			b = append(b[:i+3:i+3], ':', z[2], z[3])
		}
	}
	return string(b)
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// finerThanMicros reports whether the timestamp s has a fraction of more
// than six digits.
func finerThanMicros(s string) bool {
	dot := strings.IndexByte(s, '.')
	if dot < 0 {
		return false
	}
	n := 0
	for _, c := range s[dot+1:] {
		if c < '0' || c > '9' {
			break
		}
		n++
	}
	return n > 6
}

// scanColumns reaches what fuzzColumns does not: nested and array paths,
// paths sharing a prefix, two paths to one array element, an object as
// text, a number and a boolean as jsonb, and the payload as text.
var scanColumns = []Column{
	{Name: "a", From: "json:a", Type: TypeText},
	{Name: "ab", From: "json:a.b", Type: TypeJSONB},
	{Name: "a0", From: "json:a.0", Type: TypeText},
	{Name: "a01", From: "/a/01/x", Type: TypeInt8},
	{Name: "a1", From: "json:a.1", Type: TypeJSONB}, // the same array element as /a/01
	{Name: "t", From: "json:t", Type: TypeJSONB},
	{Name: "tn", From: "json:t", Type: TypeNumeric},
	{Name: "empty", From: "/", Type: TypeText},
	{Name: "slash", From: "/a~1b", Type: TypeText},
	{Name: "arr", From: "json:o.1", Type: TypeJSONB},
	{Name: "body", From: "payload", Type: TypeText},
}

// FuzzScanMatchesFastjson checks the scanner against the fastjson-based
// encoder it replaced (ref_encoder_test.go): the same tuple, or the same
// error with the same code, column and reason, for every payload, except
// that an invalid_json reason is the scanner's own, short, wording (see
// refusal). It also runs FuzzAppendTuple's corpus.
func FuzzScanMatchesFastjson(f *testing.F) {
	for _, s := range []string{
		string(benchPayload),
		`{"a":{"b":[1,2e3,"x"],"0":"\u00e9"},"t":1e131072,"o":[0,{"k":"\u0000"}]}`,
		`{"a":[{"x":1},{"x":"42"}],"":"e","a/b":"\ud83d\ude00","t":true}`,
		`{"\u0061":{"b":1},"a":{"b":2},"t":-0.5E-3}`,
		` [ 1 , {"a" : null} ] `,
		`{"a":[0,{"x":"42"}],"t":1}`,
		`{"a":"\"\\\/\b\f\n\r\t\u001f"}`,
		`{"a":1}x`, `{"a":01}`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}",
	} {
		f.Add([]byte(s), `{"h":1}`)
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzAppendTuple")
	ents, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, ent := range ents {
		payload, header := readCorpusEntry(f, filepath.Join(dir, ent.Name()))
		f.Add(payload, header)
	}
	for _, s := range pathPayloads {
		f.Add([]byte(s), `{"h":1}`)
	}
	maps := [][]Column{fuzzColumns, scanColumns, benchColumns, pathColumns}
	type pair struct {
		enc *Encoder
		ref *refEncoder
	}
	var encs []pair
	for _, cols := range maps {
		m := mustCompile(f, cols...)
		encs = append(encs, pair{m.NewEncoder(1 << 16), newRefEncoder(m, 1<<16)})
	}
	f.Fuzz(func(t *testing.T, payload []byte, header string) {
		ev := &Event{Data: payload, Header: map[string][]string{"H": {header}}}
		for i, p := range encs {
			got, gerr := p.enc.AppendTuple([]byte("pre"), ev)
			want, werr := p.ref.AppendTuple([]byte("pre"), ev)
			if (gerr == nil) != (werr == nil) || (gerr != nil && !sameRefusal(gerr, werr)) {
				t.Fatalf("mapping %d, payload %q:\nscanner:  %v\nfastjson: %v", i, payload, gerr, werr)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("mapping %d, payload %q:\nscanner:  %q\nfastjson: %q", i, payload, got, want)
			}
		}
	})
}

// sameRefusal reports whether the scanner's error got matches the
// reference encoder's want: the same column and code, and the same reason
// unless it is invalid_json, whose reason must then be short.
func sameRefusal(got, want error) bool {
	var g, w *DecodeError
	if !errors.As(got, &g) || !errors.As(want, &w) {
		return got.Error() == want.Error()
	}
	if g.Column != w.Column || g.Code != w.Code {
		return false
	}
	if g.Code == CodeInvalidJSON {
		return len(g.Reason) <= 200
	}
	return g.Reason == w.Reason
}

// FuzzFloat64Short checks parseFloat64Short against strconv.ParseFloat.
func FuzzFloat64Short(f *testing.F) {
	for _, s := range []string{"21.375", "-0", "-0.0", "0.1", "999999999999999", "9999999999999999", "1.000000000000001", "123456.789012345", "00000000000000.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		s, ok := pgNumberText(s, TypeFloat8)
		if !ok {
			return
		}
		got, ok := parseFloat64Short(s)
		if !ok {
			return
		}
		want, err := strconv.ParseFloat(s, 64)
		if err != nil || math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("%q: %v (%x), ParseFloat says %v (%x), %v", s, got, math.Float64bits(got), want, math.Float64bits(want), err)
		}
	})
}
