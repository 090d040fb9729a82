package pipeline

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// fields splits a binary COPY tuple into its fields; nil means NULL.
func fields(t *testing.T, tup []byte) [][]byte {
	t.Helper()
	if len(tup) < 2 {
		t.Fatalf("tuple too short: %x", tup)
	}
	n := int(binary.BigEndian.Uint16(tup))
	tup = tup[2:]
	out := make([][]byte, 0, n)
	for range n {
		if len(tup) < 4 {
			t.Fatalf("truncated tuple")
		}
		l := int32(binary.BigEndian.Uint32(tup))
		tup = tup[4:]
		if l == -1 {
			out = append(out, nil)
			continue
		}
		if int(l) > len(tup) {
			t.Fatalf("field length %d beyond tuple", l)
		}
		out = append(out, tup[:l:l])
		tup = tup[l:]
	}
	if len(tup) != 0 {
		t.Fatalf("%d trailing bytes", len(tup))
	}
	return out
}

func mustCompile(t testing.TB, cols ...Column) *Mapper {
	t.Helper()
	m, err := Compile(cols)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func hx(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// numericBytes builds a binary numeric from its parts.
func numericBytes(weight int16, sign uint16, dscale uint16, digits ...uint16) []byte {
	b := be16(uint16(len(digits)))
	b = append(b, be16(uint16(weight))...)
	b = append(b, be16(sign)...)
	b = append(b, be16(dscale)...)
	for _, d := range digits {
		b = append(b, be16(d)...)
	}
	return b
}

var null = []byte(nil)

func tsMicros(s string) []byte {
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return be64(uint64(tm.UnixMicro() - pgEpochMicros))
}

func TestAppendTupleTypes(t *testing.T) {
	type tc struct {
		name     string
		typ      Type
		json     string // the value of key "v"; "" means the key is absent
		required bool
		want     []byte // nil with code "" means NULL
		code     string
	}
	cases := []tc{
		// text
		{"text string", TypeText, `"héllo"`, false, []byte("héllo"), ""},
		{"text escapes", TypeText, `"a\"b\\c\n\u00e9"`, false, []byte("a\"b\\c\né"), ""},
		{"text number", TypeText, `21.375e0`, false, []byte("21.375e0"), ""},
		{"text bool", TypeText, `true`, false, []byte("true"), ""},
		{"text object", TypeText, `{ "a" : [1, "x\u0000"] }`, false, []byte(`{"a":[1,"x\u0000"]}`), ""},
		{"text object escapes", TypeText, `{"a":"\b\f\u0001\u001F\/\u00e9\"\\\n\r\t"}`, false, []byte(`{"a":"\b\f\u0001\u001f/é\"\\\n\r\t"}`), ""},
		{"text object duplicate keys", TypeText, `{"b":1, "b":null}`, false, []byte(`{"b":1,"b":null}`), ""}, // as written; jsonb keeps the last
		{"text NUL", TypeText, `"a\u0000b"`, false, nil, CodeNULInText},
		{"text null", TypeText, `null`, false, null, ""},
		{"text absent", TypeText, ``, false, null, ""},
		{"text required null", TypeText, `null`, true, nil, CodeRequiredMissing},
		{"text required absent", TypeText, ``, true, nil, CodeRequiredMissing},
		{"text surrogate pair", TypeText, `"\ud83d\ude00"`, false, []byte("😀"), ""},
		{"text lone surrogate", TypeText, `"\ud83d"`, false, nil, CodeInvalidJSON},
		// uuid
		{"uuid lower", TypeUUID, `"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab"`, false, hx("3f0c9a2e1b7d4c8e9f000123456789ab"), ""},
		{"uuid upper", TypeUUID, `"3F0C9A2E-1B7D-4C8E-9F00-0123456789AB"`, false, hx("3f0c9a2e1b7d4c8e9f000123456789ab"), ""},
		{"uuid braced", TypeUUID, `"{3f0c9a2e-1b7d-4c8e-9f00-0123456789ab}"`, false, nil, CodeInvalidFormat},
		{"uuid no hyphens", TypeUUID, `"3f0c9a2e1b7d4c8e9f000123456789ab"`, false, nil, CodeInvalidFormat},
		{"uuid bad hex", TypeUUID, `"3f0c9a2e-1b7d-4c8e-9f00-0123456789ag"`, false, nil, CodeInvalidFormat},
		{"uuid late hyphen", TypeUUID, `"00000000-0000-0000-0000-0000000000-0"`, false, nil, CodeInvalidFormat}, // the old loop indexed past the end
		{"uuid number", TypeUUID, `42`, false, nil, CodeWrongType},
		// ints
		{"int2", TypeInt2, `-32768`, false, be16(0x8000), ""},
		{"int2 max", TypeInt2, `32767`, false, be16(0x7fff), ""},
		{"int2 overflow", TypeInt2, `32768`, false, nil, CodeOutOfRange},
		{"int4", TypeInt4, `2147483647`, false, be32(0x7fffffff), ""},
		{"int4 neg", TypeInt4, `-1`, false, be32(0xffffffff), ""},
		{"int4 overflow", TypeInt4, `-2147483649`, false, nil, CodeOutOfRange},
		{"int8 min", TypeInt8, `-9223372036854775808`, false, be64(1 << 63), ""},
		{"int8 max", TypeInt8, `9223372036854775807`, false, be64(math.MaxInt64), ""},
		{"int8 overflow", TypeInt8, `9223372036854775808`, false, nil, CodeOutOfRange},
		{"int8 huge", TypeInt8, `123456789012345678901234567890`, false, nil, CodeOutOfRange},
		{"int8 string", TypeInt8, `"123456"`, false, be64(123456), ""},
		{"int8 string junk", TypeInt8, `"12a"`, false, nil, CodeInvalidFormat},
		{"int8 string float", TypeInt8, `"1.5"`, false, nil, CodeInvalidFormat},
		{"int8 fraction", TypeInt8, `1.5`, false, nil, CodeWrongType},
		{"int8 exponent", TypeInt8, `1e3`, false, nil, CodeWrongType},
		{"int8 bool", TypeInt8, `true`, false, nil, CodeWrongType},
		{"int8 object", TypeInt8, `{}`, false, nil, CodeWrongType},
		{"int4 negative zero", TypeInt4, `-0`, false, be32(0), ""},
		// strings as PostgreSQL's integer input reads them (pgNumberText)
		{"int4 string spaces", TypeInt4, `" \t42\n"`, false, be32(42), ""},
		{"int4 string plus", TypeInt4, `"+42"`, false, be32(42), ""},
		{"int4 string minus", TypeInt4, `" -7 "`, false, be32(0xfffffff9), ""},
		{"int4 string plus minus", TypeInt4, `"+-42"`, false, nil, CodeInvalidFormat},
		{"int4 string lone plus", TypeInt4, `"+"`, false, nil, CodeInvalidFormat},
		{"int4 string blank", TypeInt4, `"  "`, false, nil, CodeInvalidFormat},
		{"int4 string inner space", TypeInt4, `"4 2"`, false, nil, CodeInvalidFormat},
		{"int4 string underscore", TypeInt4, `"1_000"`, false, nil, CodeInvalidFormat}, // PostgreSQL 16 reads it; 15 does not
		{"int4 string hex", TypeInt4, `"0x1F"`, false, nil, CodeInvalidFormat},
		{"int4 string nbsp", TypeInt4, `"\u00a042"`, false, nil, CodeInvalidFormat},
		// floats
		{"float8", TypeFloat8, `21.375`, false, be64(math.Float64bits(21.375)), ""},
		{"float8 exp", TypeFloat8, `-1.5E-3`, false, be64(math.Float64bits(-0.0015)), ""},
		{"float8 int", TypeFloat8, `7`, false, be64(math.Float64bits(7)), ""},
		{"float8 string", TypeFloat8, `"0.25"`, false, be64(math.Float64bits(0.25)), ""},
		{"float8 NaN string", TypeFloat8, `"NaN"`, false, nil, CodeInvalidFormat},
		{"float8 Infinity string", TypeFloat8, `" Infinity"`, false, nil, CodeInvalidFormat},
		{"float8 no int part", TypeFloat8, `".5"`, false, be64(math.Float64bits(0.5)), ""},
		{"float8 no fraction", TypeFloat8, `"-1."`, false, be64(math.Float64bits(-1)), ""},
		{"float8 plus exp", TypeFloat8, `" +1.e3 "`, false, be64(math.Float64bits(1000)), ""},
		{"float8 lone point", TypeFloat8, `"."`, false, nil, CodeInvalidFormat},
		{"float8 point exp", TypeFloat8, `".e3"`, false, nil, CodeInvalidFormat},
		{"float8 no exp digits", TypeFloat8, `"1e"`, false, nil, CodeInvalidFormat},
		{"float8 hex", TypeFloat8, `"0x1p3"`, false, nil, CodeInvalidFormat},
		{"float8 overflow", TypeFloat8, `1e400`, false, nil, CodeOutOfRange},
		{"float4", TypeFloat4, `0.1`, false, be32(math.Float32bits(0.1)), ""},
		{"float4 overflow", TypeFloat4, `1e39`, false, nil, CodeOutOfRange},
		{"float8 bool", TypeFloat8, `false`, false, nil, CodeWrongType},
		// numeric
		{"numeric int", TypeNumeric, `12345`, false, numericBytes(1, 0, 0, 1, 2345), ""},
		{"numeric frac", TypeNumeric, `-12.50`, false, numericBytes(0, 0x4000, 2, 12, 5000), ""},
		{"numeric small", TypeNumeric, `0.000123`, false, numericBytes(-1, 0, 6, 1, 2300), ""},
		{"numeric zero", TypeNumeric, `0.00`, false, numericBytes(0, 0, 2), ""},
		{"numeric neg zero", TypeNumeric, `-0`, false, numericBytes(0, 0, 0), ""},
		{"numeric exp", TypeNumeric, `1.5e3`, false, numericBytes(0, 0, 0, 1500), ""},
		{"numeric big exp", TypeNumeric, `1e8`, false, numericBytes(2, 0, 0, 1), ""},
		{"numeric neg exp", TypeNumeric, `15e-5`, false, numericBytes(-1, 0, 5, 1, 5000), ""},
		{"numeric string", TypeNumeric, `"99999999.9999"`, false, numericBytes(1, 0, 4, 9999, 9999, 9999), ""},
		{"numeric huge exp", TypeNumeric, `1e99999999`, false, nil, CodeOutOfRange},
		{"numeric tiny", TypeNumeric, `1e-20000`, false, nil, CodeOutOfRange},
		{"numeric bad string", TypeNumeric, `"1,5"`, false, nil, CodeInvalidFormat},
		{"numeric no int part", TypeNumeric, `" .50"`, false, numericBytes(-1, 0, 2, 5000), ""},
		{"numeric no fraction", TypeNumeric, `"+12."`, false, numericBytes(0, 0, 0, 12), ""},
		{"numeric NaN string", TypeNumeric, `"NaN"`, false, nil, CodeInvalidFormat},
		{"numeric bool", TypeNumeric, `true`, false, nil, CodeWrongType},
		// bool
		{"bool true", TypeBool, `true`, false, []byte{1}, ""},
		{"bool false", TypeBool, `false`, false, []byte{0}, ""},
		{"bool string", TypeBool, `"true"`, false, []byte{1}, ""},
		{"bool yes", TypeBool, `"yes"`, false, []byte{1}, ""},
		{"bool Python", TypeBool, `"True"`, false, []byte{1}, ""},
		{"bool prefix", TypeBool, `" F "`, false, []byte{0}, ""},
		{"bool off", TypeBool, `"of"`, false, []byte{0}, ""},
		{"bool o", TypeBool, `"o"`, false, nil, CodeInvalidFormat},
		{"bool bad string", TypeBool, `"truth"`, false, nil, CodeInvalidFormat},
		{"bool number", TypeBool, `1`, false, nil, CodeWrongType},
		// timestamptz
		{"ts Z", TypeTimestamptz, `"2026-11-29T19:59:15.123456Z"`, false, tsMicros("2026-11-29T19:59:15.123456Z"), ""},
		{"ts offset", TypeTimestamptz, `"2026-11-29T21:59:15+02:00"`, false, tsMicros("2026-11-29T19:59:15Z"), ""},
		{"ts neg offset", TypeTimestamptz, `"2026-11-29T19:59:15.5-05:30"`, false, tsMicros("2026-11-30T01:29:15.5Z"), ""},
		{"ts nanos round", TypeTimestamptz, `"2000-01-01T00:00:00.0000015Z"`, false, be64(2), ""},
		{"ts nanos trunc", TypeTimestamptz, `"2000-01-01T00:00:00.0000014999Z"`, false, be64(1), ""},
		{"ts round carry", TypeTimestamptz, `"1999-12-31T23:59:59.9999999Z"`, false, be64(0), ""},
		{"ts before epoch", TypeTimestamptz, `"1970-01-01T00:00:00Z"`, false, tsMicros("1970-01-01T00:00:00Z"), ""},
		{"ts year 0", TypeTimestamptz, `"0000-03-01T00:00:00Z"`, false, tsMicros("0000-03-01T00:00:00Z"), ""},
		{"ts lowercase", TypeTimestamptz, `"2026-11-29t19:59:15z"`, false, tsMicros("2026-11-29T19:59:15Z"), ""},
		{"ts no zone", TypeTimestamptz, `"2026-11-29T19:59:15"`, false, nil, CodeInvalidFormat},
		{"ts space", TypeTimestamptz, `"2026-11-29 19:59:15Z"`, false, tsMicros("2026-11-29T19:59:15Z"), ""},
		{"ts postgres output", TypeTimestamptz, `"2026-11-29 19:59:15.123+00"`, false, tsMicros("2026-11-29T19:59:15.123Z"), ""},
		{"ts no seconds", TypeTimestamptz, `"2026-11-29T10:15Z"`, false, tsMicros("2026-11-29T10:15:00Z"), ""},
		{"ts no seconds offset", TypeTimestamptz, `"2026-11-29T10:15+05:30"`, false, tsMicros("2026-11-29T04:45:00Z"), ""},
		{"ts offset hours", TypeTimestamptz, `"2026-11-29T19:59:15-08"`, false, tsMicros("2026-11-30T03:59:15Z"), ""},
		{"ts offset no colon", TypeTimestamptz, `"2026-11-29T19:59:15.5+0530"`, false, tsMicros("2026-11-29T14:29:15.5Z"), ""},
		{"ts fraction without seconds", TypeTimestamptz, `"2026-11-29T10:15.5Z"`, false, nil, CodeInvalidFormat},
		{"ts offset 3 digits", TypeTimestamptz, `"2026-11-29T19:59:15+053"`, false, nil, CodeInvalidFormat},
		{"ts offset seconds", TypeTimestamptz, `"1850-01-01T00:00:00+00:19:32"`, false, tsMicros("1849-12-31T23:40:28Z"), ""},
		{"ts no seconds offset seconds", TypeTimestamptz, `"1850-01-01T00:00-05:53:28"`, false, tsMicros("1850-01-01T05:53:28Z"), ""},
		{"ts offset second 60", TypeTimestamptz, `"1850-01-01T00:00:00+00:19:60"`, false, nil, CodeInvalidFormat},
		{"ts offset one-digit second", TypeTimestamptz, `"1850-01-01T00:00:00+00:19:3"`, false, nil, CodeInvalidFormat},
		{"ts offset seconds no colon", TypeTimestamptz, `"1850-01-01T00:00:00+001932"`, false, nil, CodeInvalidFormat},
		{"ts one-digit second", TypeTimestamptz, `"2026-11-29T19:59:1Z"`, false, nil, CodeInvalidFormat},
		{"ts space UTC", TypeTimestamptz, `"2026-11-29 19:59:15 UTC"`, false, tsMicros("2026-11-29T19:59:15Z"), ""}, // Ruby's Time#to_s
		{"ts UTC attached", TypeTimestamptz, `"2026-11-29T19:59:15.5utc"`, false, tsMicros("2026-11-29T19:59:15.5Z"), ""},
		{"ts space GMT", TypeTimestamptz, `"2026-11-29 19:59 GMT"`, false, tsMicros("2026-11-29T19:59:00Z"), ""},
		{"ts space offset", TypeTimestamptz, `"2026-11-29 19:59:15 +0530"`, false, tsMicros("2026-11-29T14:29:15Z"), ""},
		{"ts spaces offset", TypeTimestamptz, `"2026-11-29T19:59:15  -01:00"`, false, tsMicros("2026-11-29T20:59:15Z"), ""},
		{"ts white space around", TypeTimestamptz, `" \t2026-11-29T19:59:15Z\n"`, false, tsMicros("2026-11-29T19:59:15Z"), ""},
		{"ts named zone", TypeTimestamptz, `"2026-11-29 19:59:15 EST"`, false, nil, CodeInvalidFormat},          // its meaning is the server's setting
		{"ts Go String", TypeTimestamptz, `"2026-11-29 19:59:15.123 +0000 UTC"`, false, nil, CodeInvalidFormat}, // PostgreSQL refuses it too
		{"ts space only", TypeTimestamptz, `"2026-11-29 19:59:15 "`, false, nil, CodeInvalidFormat},
		{"ts two separators", TypeTimestamptz, `"2026-11-29  19:59:15Z"`, false, nil, CodeInvalidFormat},
		{"ts bad day", TypeTimestamptz, `"2026-02-29T00:00:00Z"`, false, nil, CodeInvalidFormat},
		{"ts leap day", TypeTimestamptz, `"2024-02-29T00:00:00Z"`, false, tsMicros("2024-02-29T00:00:00Z"), ""},
		{"ts leap second", TypeTimestamptz, `"2016-12-31T23:59:60Z"`, false, tsMicros("2017-01-01T00:00:00Z"), ""},
		{"ts leap second fraction", TypeTimestamptz, `"2016-12-31T23:59:60.5Z"`, false, tsMicros("2017-01-01T00:00:00.5Z"), ""},
		{"ts leap second fraction, other offset", TypeTimestamptz, `"2016-12-31T18:59:60.5-05:00"`, false, tsMicros("2017-01-01T00:00:00.5Z"), ""},
		{"ts leap second rounded", TypeTimestamptz, `"2016-12-31T23:59:60.0000004Z"`, false, tsMicros("2017-01-01T00:00:00Z"), ""},
		{"ts second 61", TypeTimestamptz, `"2016-12-31T23:59:61Z"`, false, nil, CodeInvalidFormat},
		{"ts hour 24", TypeTimestamptz, `"2026-11-29T24:00:00Z"`, false, tsMicros("2026-11-30T00:00:00Z"), ""},
		{"ts hour 24 no seconds", TypeTimestamptz, `"2026-11-29T24:00+14:00"`, false, tsMicros("2026-11-29T10:00:00Z"), ""},
		{"ts hour 24 rounded", TypeTimestamptz, `"2026-11-29T24:00:00.0000004Z"`, false, tsMicros("2026-11-30T00:00:00Z"), ""},
		{"ts hour 24 past", TypeTimestamptz, `"2026-11-29T24:00:01Z"`, false, nil, CodeInvalidFormat},
		{"ts hour 24 minute", TypeTimestamptz, `"2026-11-29T24:01Z"`, false, nil, CodeInvalidFormat},
		{"ts hour 24 fraction", TypeTimestamptz, `"2026-11-29T24:00:00.000001Z"`, false, nil, CodeInvalidFormat},
		{"ts hour 25", TypeTimestamptz, `"2026-11-29T25:00:00Z"`, false, nil, CodeInvalidFormat},
		{"ts infinity", TypeTimestamptz, `"Infinity"`, false, be64(math.MaxInt64), ""},
		{"ts -infinity", TypeTimestamptz, `"-infinity"`, false, be64(1 << 63), ""},
		{"ts +infinity", TypeTimestamptz, `"+infinity"`, false, nil, CodeInvalidFormat},
		{"ts infinite", TypeTimestamptz, `"infinite"`, false, nil, CodeInvalidFormat},
		{"ts empty frac", TypeTimestamptz, `"2026-11-29T19:59:15.Z"`, false, nil, CodeInvalidFormat},
		{"ts number", TypeTimestamptz, `1764446355`, false, nil, CodeWrongType},
		// date
		{"date", TypeDate, `"2000-01-02"`, false, be32(1), ""},
		{"date before", TypeDate, `"1999-12-31"`, false, be32(0xffffffff), ""},
		{"date bad", TypeDate, `"2026-13-01"`, false, nil, CodeInvalidFormat},
		{"date infinity", TypeDate, `"INFINITY"`, false, be32(math.MaxInt32), ""},
		{"date -infinity", TypeDate, `"-Infinity"`, false, be32(0x80000000), ""},
		{"date with time", TypeDate, `"2000-01-02T23:30:00-05:00"`, false, be32(1), ""}, // the date as written, as PostgreSQL keeps it
		{"date with local time", TypeDate, `" 2000-01-02 10:00 "`, false, be32(1), ""},
		{"date with bad time", TypeDate, `"2000-01-02T25:00"`, false, nil, CodeInvalidFormat},
		{"date with bad zone", TypeDate, `"2000-01-02T10:00 EST"`, false, nil, CodeInvalidFormat},
		{"date T only", TypeDate, `"2000-01-02T"`, false, nil, CodeInvalidFormat},
		{"date number", TypeDate, `20261129`, false, nil, CodeWrongType},
		// jsonb
		{"jsonb object", TypeJSONB, `{"a": 1, "b\n": ["x", null, true]}`, false, append([]byte{1}, `{"a":1,"b\n":["x",null,true]}`...), ""},
		{"jsonb string", TypeJSONB, `"a\"b"`, false, append([]byte{1}, `"a\"b"`...), ""},
		{"jsonb escapes", TypeJSONB, `{"\b":"\u0008\f\u000C\u001f"}`, false, append([]byte{1}, `{"\b":"\b\f\f\u001f"}`...), ""},
		{"jsonb string escapes", TypeJSONB, `"\u0008\f\u0001"`, false, append([]byte{1}, `"\b\f\u0001"`...), ""},
		{"jsonb number", TypeJSONB, `1.50`, false, append([]byte{1}, `1.50`...), ""},
		{"jsonb bool", TypeJSONB, `false`, false, append([]byte{1}, `false`...), ""},
		{"jsonb NUL", TypeJSONB, `{"a":"\u0000"}`, false, nil, CodeNULInText},
		{"jsonb NUL string", TypeJSONB, `"\u0000"`, false, nil, CodeNULInText},
		{"jsonb null is NULL", TypeJSONB, `null`, false, null, ""},
		{"jsonb big number", TypeJSONB, `1e131072`, false, nil, CodeOutOfRange},
		{"jsonb nested big number", TypeJSONB, `{"x":[1e-16384]}`, false, nil, CodeOutOfRange},
		{"jsonb number at the limit", TypeJSONB, `[1e131071]`, false, append([]byte{1}, `[1e131071]`...), ""},
		// bytea
		{"bytea", TypeBytea, `"AAEC/w=="`, false, []byte{0, 1, 2, 0xff}, ""},
		{"bytea empty", TypeBytea, `""`, false, []byte{}, ""},
		{"bytea bad", TypeBytea, `"AAEC/w"`, false, nil, CodeInvalidFormat},
		{"bytea one byte", TypeBytea, `"QQ=="`, false, []byte("A"), ""},
		{"bytea two bytes", TypeBytea, `"QUI="`, false, []byte("AB"), ""},
		// Strict: nonzero bits after the last byte ("QR==" would also be
		// "A", "QUJ=" also "AB") and line breaks, which a lax decoder skips.
		{"bytea padding bits", TypeBytea, `"QR=="`, false, nil, CodeInvalidFormat},
		{"bytea padding bits 2", TypeBytea, `"QUJ="`, false, nil, CodeInvalidFormat},
		{"bytea LF", TypeBytea, `"AAEC\n/w=="`, false, nil, CodeInvalidFormat},
		{"bytea CR LF", TypeBytea, `"AAEC/w==\r\n"`, false, nil, CodeInvalidFormat},
		{"bytea CR", TypeBytea, `"\rQQ=="`, false, nil, CodeInvalidFormat},
		{"bytea space", TypeBytea, `"AAEC /w=="`, false, nil, CodeInvalidFormat},
		{"bytea URL alphabet", TypeBytea, `"AAEC_w=="`, false, nil, CodeInvalidFormat},
		{"bytea number", TypeBytea, `1`, false, nil, CodeWrongType},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustCompile(t, Column{Name: "v", From: "json:v", Type: c.typ, Required: c.required})
			payload := `{"other":1}`
			if c.json != "" {
				payload = `{"other":1,"v":` + c.json + `}`
			}
			ev := &Event{Data: []byte(payload)}
			prefix := []byte("keep")
			got, err := m.NewEncoder(0).AppendTuple(prefix, ev)
			if c.code != "" {
				var de *DecodeError
				if !errors.As(err, &de) {
					t.Fatalf("err = %v, want a *DecodeError with code %s", err, c.code)
				}
				if de.Code != c.code {
					t.Fatalf("code = %s (%v), want %s", de.Code, err, c.code)
				}
				if string(got) != "keep" {
					t.Fatalf("dst changed on error: %q", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !bytes.HasPrefix(got, prefix) {
				t.Fatalf("prefix lost")
			}
			f := fields(t, got[len(prefix):])
			if len(f) != 1 {
				t.Fatalf("%d fields", len(f))
			}
			if (c.want == nil) != (f[0] == nil) || !bytes.Equal(f[0], c.want) {
				t.Fatalf("field = %x (%q), want %x (%q)", f[0], f[0], c.want, c.want)
			}
		})
	}
}

// Metadata times are rounded to microseconds, as PostgreSQL rounds the
// same instant written as text, not truncated.
func TestAppendTimeRounds(t *testing.T) {
	for _, c := range []struct {
		ns   int64 // past 2000-01-01T00:00:00Z
		want int64 // µs
	}{{900, 1}, {499, 0}, {1500, 2}, {-900, -1}} {
		tm := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(c.ns))
		got, err := appendTime(nil, TypeTimestamptz, tm)
		if err != nil || !bytes.Equal(got, be64(uint64(c.want))) {
			t.Errorf("%v: %x (%v), want %d µs", tm, got, err, c.want)
		}
	}
}

// A value of short escapes is written back short: a hostile payload of \b
// (or \f) escapes is not re-encoded as \u0008, three times its size, in
// each column that reads it.
func TestShortEscapesDoNotGrow(t *testing.T) {
	const n = 1 << 18
	esc := strings.Repeat(`\b\f`, n/2) // n escapes, 2n bytes
	payload := []byte(`{"o":{"s":"` + esc + `"},"s":"` + esc + `"}`)
	m := mustCompile(t,
		Column{Name: "ot", From: "json:o", Type: TypeText},
		Column{Name: "oj", From: "json:o", Type: TypeJSONB},
		Column{Name: "sj", From: "json:s", Type: TypeJSONB},
	)
	tup, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: payload})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range fields(t, tup) {
		if len(f) > 2*n+16 {
			t.Errorf("field %d: %d bytes for %d bytes of escapes", i, len(f), 2*n)
		}
	}
}

// White space around "infinity" is skipped whatever the length, including
// the ten bytes of a plain date (" -infinity"), as PostgreSQL's date input
// skips it.
func TestParseDateInfinityWithSpace(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int32
	}{
		{" -infinity", math.MinInt32}, {"-infinity ", math.MinInt32}, {" infinity ", math.MaxInt32},
		{"  infinity", math.MaxInt32}, {"infinity\t\t", math.MaxInt32}, {"\ninfinity ", math.MaxInt32},
		{" infinity", math.MaxInt32}, {"  -infinity ", math.MinInt32}, // 9 and 12 bytes
		{" 2026-11-29", 9829}, {"2026-11-29 ", 9829}, {"2026-11-29", 9829},
	} {
		if got, ok := parseDate(c.s); !ok || got != c.want {
			t.Errorf("parseDate(%q) = %d, %v; want %d", c.s, got, ok, c.want)
		}
	}
	for _, s := range []string{" 2026-11-2", "2026-11-2 ", "xinfinity ", " infinityx"} {
		if got, ok := parseDate(s); ok {
			t.Errorf("parseDate(%q) = %d, want refused", s, got)
		}
	}
}

// A wrong_type reason reads as English: "an int4 column", "a uuid column".
func TestWrongTypeArticle(t *testing.T) {
	m := mustCompile(t, Column{Name: "n", From: "json:v", Type: TypeInt4})
	_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{"v":true}`)})
	if de, ok := err.(*DecodeError); !ok || de.Code != CodeWrongType || !strings.Contains(de.Reason, "an int4 column cannot take a boolean") {
		t.Errorf("int4 from true: %v, want wrong_type: ... an int4 column cannot take a boolean", err)
	}
	for _, c := range []struct {
		t    Type
		want string
	}{
		{TypeText, "a text"}, {TypeUUID, "a uuid"}, {TypeInt2, "an int2"}, {TypeInt4, "an int4"}, {TypeInt8, "an int8"},
		{TypeFloat4, "a float4"}, {TypeFloat8, "a float8"}, {TypeNumeric, "a numeric"}, {TypeBool, "a bool"},
		{TypeTimestamptz, "a timestamptz"}, {TypeDate, "a date"}, {TypeJSONB, "a jsonb"}, {TypeBytea, "a bytea"},
	} {
		if r := wrongType(c.t, "an object").Reason; !strings.HasPrefix(r, c.want+" column cannot take an object") {
			t.Errorf("%s: %q, want it to begin %q", c.t, r, c.want+" column")
		}
	}
}

// A numeric column reads white space after the exponent marker, as
// PostgreSQL 15's numeric_in does (its strtol skips it); float8in's strtod
// does not, nor does the float columns' input here.
func TestNumericExponentSpace(t *testing.T) {
	for _, c := range []struct{ in, same string }{
		{"1e 5", "1e5"}, {" 1.50E\t-2 ", "1.50e-2"}, {"2e\n\v+3", "2e+3"},
	} {
		got, gerr := appendString(nil, TypeNumeric, c.in, true)
		want, werr := appendNumeric(nil, c.same)
		if gerr != nil || werr != nil || !bytes.Equal(got, want) {
			t.Errorf("numeric %q: %x (%v), want %x as %q", c.in, got, gerr, want, c.same)
		}
	}
	for _, typ := range []Type{TypeNumeric, TypeFloat8, TypeFloat4, TypeInt8} {
		for _, in := range []string{"1e+ 5", "1e ", "1 e5", "1e 5.5"} {
			if _, derr := appendString(nil, typ, in, true); derr == nil || derr.Code != CodeInvalidFormat {
				t.Errorf("%s %q: %v, want invalid_format", typ, in, derr)
			}
		}
	}
	for _, typ := range []Type{TypeFloat8, TypeFloat4, TypeInt8} {
		if _, derr := appendString(nil, typ, "1e 5", true); derr == nil || derr.Code != CodeInvalidFormat {
			t.Errorf("%s %q: %v, want invalid_format", typ, "1e 5", derr)
		}
	}
}

// A timestamptz or date refused for one wrong part says which: no zone
// (Python's naive isoformat, Java's LocalDateTime), a zone name, an offset
// or a time of day out of range, a date that does not exist. Anything else
// gets the example of the form wanted.
func TestTimeRefusalReasons(t *testing.T) {
	m := mustCompile(t, Column{Name: "ts", From: "json:ts", Type: TypeTimestamptz})
	_, err := m.NewEncoder(0).AppendTuple(nil, &Event{Data: []byte(`{"ts":"2026-11-29T10:15:00"}`)})
	if de, ok := err.(*DecodeError); !ok || de.Code != CodeInvalidFormat || !strings.Contains(de.Reason, "no time zone: add Z or an offset") {
		t.Errorf("naive timestamp: %v, want invalid_format: ... no time zone: add Z or an offset ...", err)
	}
	const (
		noZone    = "no time zone: add Z or an offset such as +01:00"
		named     = "time zone named other than UTC or GMT"
		offset    = "time zone offset out of range"
		clock     = "time of day out of range"
		tsExample = "want RFC 3339 such as 2026-11-29T19:59:15.123456Z"
	)
	for _, c := range []struct {
		t       Type
		in, why string
	}{
		{TypeTimestamptz, "2026-11-29T10:15:00", noZone},
		{TypeTimestamptz, " 2026-11-29 10:15:00.123456789 ", noZone},
		{TypeTimestamptz, "2026-11-29T10:15", noZone},
		{TypeTimestamptz, "2026-11-29", "no time of day and no time zone"},
		{TypeTimestamptz, "2026-11-29T10:15:00 EST", named},
		{TypeTimestamptz, "2026-11-29T10:15:00Europe/Paris", named},
		{TypeTimestamptz, "2026-11-29T10:15:00 Etc/GMT+5", named},
		{TypeTimestamptz, "2026-11-29T10:15:00+24:00", offset},
		{TypeTimestamptz, "2026-11-29T10:15:00-0560", offset},
		{TypeTimestamptz, "2026-11-29T10:15:00+00:19:60", offset},
		{TypeTimestamptz, "2026-02-29T10:15:00Z", "no such date: 2026-02 has 28 days"},
		{TypeTimestamptz, "2026-13-01T10:15:00Z", "no such date: month 13"},
		{TypeTimestamptz, "2026-11-00T10:15:00Z", "no such date: day 00"},
		{TypeTimestamptz, "2026-11-29T25:00:00Z", clock},
		{TypeTimestamptz, "2026-11-29T10:60:00Z", clock},
		{TypeTimestamptz, "2026-11-29T10:15:61Z", clock},
		{TypeTimestamptz, "2026-11-29T24:00:01Z", clock},
		{TypeTimestamptz, "2026-11-29T24:00:00.5Z", clock},
		{TypeTimestamptz, "1764410100", tsExample},
		{TypeTimestamptz, "2026-11-29T10:15:00+1", tsExample},
		{TypeTimestamptz, "2026-11-29T10:15:00.Z", tsExample},
		{TypeTimestamptz, "2026-11-29T10:15:00Z!", tsExample},
		{TypeTimestamptz, "2026-11-29T1:15:00Z", tsExample},
		{TypeTimestamptz, "29/11/2026", tsExample},
		{TypeTimestamptz, "", tsExample},
		{TypeDate, "2026-02-29", "no such date: 2026-02 has 28 days"},
		{TypeDate, " 2026-00-10 ", "no such date: month 00"},
		{TypeDate, "2026-11-29T25:00", clock},
		{TypeDate, "2026-11-29T10:00 EST", named},
		{TypeDate, "2026-11-29T10:00+99:00", offset},
		{TypeDate, "2026-11-29T", "want YYYY-MM-DD"},
		{TypeDate, "29.11.2026", "want YYYY-MM-DD"},
	} {
		_, derr := appendString(nil, c.t, c.in, true)
		if derr == nil || derr.Code != CodeInvalidFormat || !strings.Contains(derr.Reason, c.why) {
			t.Errorf("%s %q: %v, want invalid_format: ... %s", c.t, c.in, derr, c.why)
		}
	}
}
