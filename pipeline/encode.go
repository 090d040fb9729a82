package pipeline

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fastjson"
)

// Encoder holds the reusable state one goroutine needs to turn events into
// tuples: a JSON parser and scratch space. It is not safe for concurrent
// use; give each worker its own (Mapper.NewEncoder). After the first few
// events an Encoder allocates nothing on the success path.
type Encoder struct {
	m             *Mapper
	maxEventBytes int64
	p             fastjson.Parser
	nul           bool   // the current payload holds a \u0000 escape
	bigNum        bool   // the current payload may hold a number beyond numeric's range
	scratch       []byte // a number's JSON text
	numBuf        []byte // throwaway output of numeric range checks
}

// NewEncoder returns an Encoder for m. Payloads longer than maxEventBytes
// fail with CodeTooLarge; 0 or less means no limit.
func (m *Mapper) NewEncoder(maxEventBytes int64) *Encoder {
	return &Encoder{m: m, maxEventBytes: maxEventBytes}
}

// isNull is the internal marker a value encoder returns for SQL NULL.
var isNull = &DecodeError{Code: "null"}

// AppendTuple appends ev as one binary COPY tuple to dst and returns the
// extended slice. On failure it returns dst unchanged (same length) and a
// *DecodeError naming the column and the reason; the event should then be
// dead-lettered. Nothing of ev is retained.
func (e *Encoder) AppendTuple(dst []byte, ev *Event) ([]byte, error) {
	m := e.m
	data := ev.Data
	if e.maxEventBytes > 0 && int64(len(data)) > e.maxEventBytes {
		return dst, &DecodeError{Code: CodeTooLarge, Reason: "payload is " + strconv.Itoa(len(data)) +
			" bytes; max_event_bytes is " + strconv.FormatInt(e.maxEventBytes, 10)}
	}
	var root *fastjson.Value
	e.nul, e.bigNum = false, false
	if m.needJSON {
		var derr *DecodeError
		if root, derr = e.parse(data); derr != nil {
			return dst, derr
		}
	}
	start := len(dst)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(m.cols)))
	for i := range m.cols {
		c := &m.cols[i]
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		var derr *DecodeError
		switch c.src {
		case srcJSON:
			v := root.Get(c.path...)
			if v == nil || v.Type() == fastjson.TypeNull {
				derr = isNull
				break
			}
			dst, derr = e.appendJSONValue(dst, c.Type, v)
		case srcPayload:
			dst, derr = e.appendPayload(dst, c.Type, data, root)
		case srcHeader:
			vs := ev.Header[c.path[0]]
			if len(vs) == 0 {
				derr = isNull
				break
			}
			dst, derr = appendString(dst, c.Type, vs[0], false)
		default:
			dst, derr = appendMeta(dst, c, ev)
		}
		switch {
		case derr == isNull:
			if c.Required {
				return dst[:start], &DecodeError{Column: c.Name, Code: CodeRequiredMissing,
					Reason: "value of " + c.From + " is missing or null and the column is required"}
			}
			dst = dst[:at]
			dst = binary.BigEndian.AppendUint32(dst, math.MaxUint32) // -1: NULL
		case derr != nil:
			derr.Column = c.Name
			return dst[:start], derr
		default:
			n := len(dst) - at - 4
			if n > math.MaxInt32 {
				return dst[:start], &DecodeError{Column: c.Name, Code: CodeTooLarge, Reason: "value exceeds 2 GiB"}
			}
			binary.BigEndian.PutUint32(dst[at:], uint32(n))
		}
	}
	return dst, nil
}

// parse checks that data is JSON PostgreSQL would accept and parses it.
func (e *Encoder) parse(data []byte) (*fastjson.Value, *DecodeError) {
	if !utf8.Valid(data) {
		return nil, &DecodeError{Code: CodeInvalidUTF8, Reason: "payload is not valid UTF-8"}
	}
	// fastjson's parser is lenient (NaN, raw control characters, bad
	// escapes); its validator is strict, so run it first.
	if err := fastjson.ValidateBytes(data); err != nil {
		return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload is not valid JSON: " + trimTail(err.Error())}
	}
	if bytes.IndexByte(data, '\\') >= 0 {
		nul, ok := scanEscapes(data)
		if !ok {
			return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload has a lone UTF-16 surrogate escape"}
		}
		e.nul = nul
	}
	e.bigNum = len(data) > numericMaxDScale || mayHaveExponent(data)
	root, err := e.p.ParseBytes(data)
	if err != nil { // nesting deeper than fastjson.MaxDepth
		return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload is not valid JSON: " + trimTail(err.Error())}
	}
	return root, nil
}

// trimTail drops the payload excerpt fastjson appends to its errors.
func trimTail(s string) string {
	if i := strings.Index(s, "; unparsed tail"); i >= 0 {
		return s[:i]
	}
	if i := strings.Index(s, ": \""); i >= 0 && strings.HasPrefix(s, "unexpected tail") {
		return s[:i]
	}
	return s
}

// scanEscapes walks the escapes of valid JSON text. nul reports a \u0000
// escape; ok is false for a surrogate escape that is not part of a pair,
// which PostgreSQL's JSON parser refuses.
func scanEscapes(b []byte) (nul, ok bool) {
	for {
		i := bytes.IndexByte(b, '\\')
		if i < 0 || i+1 >= len(b) {
			return nul, true
		}
		b = b[i+1:]
		if b[0] != 'u' {
			b = b[1:]
			continue
		}
		r := hex4(b[1:])
		b = b[5:]
		switch {
		case r == 0:
			nul = true
		case r >= 0xD800 && r <= 0xDBFF:
			if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
				return nul, false
			}
			if lo := hex4(b[2:]); lo < 0xDC00 || lo > 0xDFFF {
				return nul, false
			}
			b = b[6:]
		case r >= 0xDC00 && r <= 0xDFFF:
			return nul, false
		}
	}
}

// hex4 decodes four hex digits, already validated by the JSON validator.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendJSONValue encodes a non-null JSON value as type t.
func (e *Encoder) appendJSONValue(dst []byte, t Type, v *fastjson.Value) ([]byte, *DecodeError) {
	switch v.Type() {
	case fastjson.TypeString:
		sb, _ := v.StringBytes()
		return appendString(dst, t, b2s(sb), true)
	case fastjson.TypeNumber:
		switch t {
		case TypeText:
			return v.MarshalTo(dst), nil // the number's JSON text
		case TypeJSONB:
			if e.bigNum && !e.numbersFit(v) {
				return dst, jsonbNumberRange()
			}
			return v.MarshalTo(append(dst, 1)), nil
		case TypeInt2, TypeInt4, TypeInt8, TypeFloat4, TypeFloat8, TypeNumeric:
		default:
			return dst, wrongType(t, "a number")
		}
		e.scratch = v.MarshalTo(e.scratch[:0])
		return appendNumber(dst, t, b2s(e.scratch), true)
	case fastjson.TypeTrue, fastjson.TypeFalse:
		b := v.Type() == fastjson.TypeTrue
		switch t {
		case TypeBool:
			if b {
				return append(dst, 1), nil
			}
			return append(dst, 0), nil
		case TypeText:
			return strconv.AppendBool(dst, b), nil
		case TypeJSONB:
			return strconv.AppendBool(append(dst, 1), b), nil
		}
		return dst, wrongType(t, "a boolean")
	default: // object or array
		switch t {
		case TypeText:
			dst, _ = appendJSON(dst, v)
			return dst, nil
		case TypeJSONB:
			if e.bigNum && !e.numbersFit(v) {
				return dst, jsonbNumberRange()
			}
			var nul bool
			dst, nul = appendJSON(append(dst, 1), v)
			if nul {
				return dst, nulInJSONB()
			}
			return dst, nil
		}
		if v.Type() == fastjson.TypeObject {
			return dst, wrongType(t, "an object")
		}
		return dst, wrongType(t, "an array")
	}
}

// mayHaveExponent reports whether b holds a digit followed by e or E: a
// cheap over-approximation of "b holds a number with an exponent".
func mayHaveExponent(b []byte) bool {
	for i := 1; i < len(b); i++ {
		if (b[i] == 'e' || b[i] == 'E') && b[i-1] >= '0' && b[i-1] <= '9' {
			return true
		}
	}
	return false
}

// numbersFit reports whether every number in v fits PostgreSQL's numeric,
// which jsonb stores its numbers in (it refuses 1e131072 or 1e-16384 with
// SQLSTATE 22003). Only called when the payload may hold such a number.
func (e *Encoder) numbersFit(v *fastjson.Value) bool {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		ok := true
		o.Visit(func(_ []byte, vv *fastjson.Value) { ok = ok && e.numbersFit(vv) })
		return ok
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, vv := range a {
			if !e.numbersFit(vv) {
				return false
			}
		}
		return true
	case fastjson.TypeNumber:
		e.scratch = v.MarshalTo(e.scratch[:0])
		if len(e.scratch) < 64 && bytes.IndexByte(e.scratch, 'e') < 0 && bytes.IndexByte(e.scratch, 'E') < 0 {
			return true // short and without exponent: far inside the range
		}
		var derr *DecodeError
		e.numBuf, derr = appendNumeric(e.numBuf[:0], b2s(e.scratch))
		return derr == nil
	default:
		return true
	}
}

func jsonbNumberRange() *DecodeError {
	return &DecodeError{Code: CodeOutOfRange, Reason: "a JSON number is beyond the range of numeric, in which PostgreSQL jsonb stores numbers"}
}

// appendPayload encodes the whole payload as type t.
func (e *Encoder) appendPayload(dst []byte, t Type, data []byte, root *fastjson.Value) ([]byte, *DecodeError) {
	switch t {
	case TypeJSONB:
		if e.nul {
			return dst, nulInJSONB()
		}
		if e.bigNum && !e.numbersFit(root) {
			return dst, jsonbNumberRange()
		}
		return append(append(dst, 1), data...), nil
	case TypeText:
		if derr := checkText(b2s(data)); derr != nil {
			return dst, derr
		}
		return append(dst, data...), nil
	default: // bytea
		return append(dst, data...), nil
	}
}

// appendMeta encodes one of the event's metadata fields.
func appendMeta(dst []byte, c *column, ev *Event) ([]byte, *DecodeError) {
	switch c.src {
	case srcMetaStream:
		return appendString(dst, c.Type, ev.Stream, false)
	case srcMetaSubject:
		return appendString(dst, c.Type, ev.Subject, false)
	case srcMetaMsgID:
		if ev.MsgID == "" {
			return dst, isNull
		}
		return appendString(dst, c.Type, ev.MsgID, false)
	case srcMetaStreamSeq:
		return appendUint(dst, c.Type, ev.StreamSeq)
	case srcMetaConsumerSeq:
		return appendUint(dst, c.Type, ev.ConsumerSeq)
	case srcMetaDelivered:
		return appendUint(dst, c.Type, ev.Delivered)
	case srcMetaPublished:
		return appendTime(dst, c.Type, ev.Published)
	default: // srcMetaReceived
		return appendTime(dst, c.Type, ev.Received)
	}
}

func appendUint(dst []byte, t Type, u uint64) ([]byte, *DecodeError) {
	switch t {
	case TypeText:
		return strconv.AppendUint(dst, u, 10), nil
	case TypeNumeric:
		var buf [20]byte
		return appendNumeric(dst, b2s(strconv.AppendUint(buf[:0], u, 10)))
	}
	if u > math.MaxInt64 {
		return dst, outOfRange(t, "")
	}
	return appendIntValue(dst, t, int64(u))
}

// pgEpochMicros is 2000-01-01 00:00:00 UTC in microseconds since the Unix epoch.
const pgEpochMicros = 946684800 * 1_000_000

func appendTime(dst []byte, t Type, tm time.Time) ([]byte, *DecodeError) {
	if tm.IsZero() {
		return dst, isNull
	}
	if t == TypeText {
		return tm.UTC().AppendFormat(dst, time.RFC3339Nano), nil
	}
	us := tm.UnixMicro() - pgEpochMicros
	return binary.BigEndian.AppendUint64(dst, uint64(us)), nil
}

// appendString encodes a string value (a JSON string when fromJSON, else a
// header or metadata value) as type t.
func appendString(dst []byte, t Type, s string, fromJSON bool) ([]byte, *DecodeError) {
	switch t {
	case TypeText:
		if derr := checkText(s); derr != nil {
			return dst, derr
		}
		return append(dst, s...), nil
	case TypeUUID:
		return appendUUID(dst, s)
	case TypeInt2, TypeInt4, TypeInt8, TypeFloat4, TypeFloat8, TypeNumeric:
		return appendNumber(dst, t, s, false)
	case TypeBool:
		switch s {
		case "true":
			return append(dst, 1), nil
		case "false":
			return append(dst, 0), nil
		}
		return dst, invalidFormat(t, `want "true" or "false"`)
	case TypeTimestamptz:
		us, derr := parseTimestamp(s)
		if derr != nil {
			return dst, derr
		}
		return binary.BigEndian.AppendUint64(dst, uint64(us)), nil
	case TypeDate:
		d, ok := parseDate(s)
		if !ok {
			return dst, invalidFormat(t, "want YYYY-MM-DD")
		}
		return binary.BigEndian.AppendUint32(dst, uint32(d)), nil
	case TypeJSONB:
		if fromJSON { // the JSON string itself becomes a jsonb string
			if strings.IndexByte(s, 0) >= 0 {
				return dst, nulInJSONB()
			}
			return appendJSONString(append(dst, 1), s), nil
		}
		return appendJSONText(dst, s)
	default: // bytea
		if !fromJSON {
			return append(dst, s...), nil
		}
		return appendBase64(dst, s)
	}
}

// appendJSONText validates s (a header value) as JSON for a jsonb column.
func appendJSONText(dst []byte, s string) ([]byte, *DecodeError) {
	if !utf8.ValidString(s) {
		return dst, &DecodeError{Code: CodeInvalidUTF8, Reason: "value is not valid UTF-8"}
	}
	if err := fastjson.Validate(s); err != nil {
		return dst, &DecodeError{Code: CodeInvalidJSON, Reason: "value is not valid JSON: " + trimTail(err.Error())}
	}
	if strings.IndexByte(s, '\\') >= 0 {
		nul, ok := scanEscapes(s2bView(s))
		if !ok {
			return dst, &DecodeError{Code: CodeInvalidJSON, Reason: "value has a lone UTF-16 surrogate escape"}
		}
		if nul {
			return dst, nulInJSONB()
		}
	}
	return append(append(dst, 1), s...), nil
}

func checkText(s string) *DecodeError {
	if strings.IndexByte(s, 0) >= 0 {
		return &DecodeError{Code: CodeNULInText, Reason: "text contains a NUL character, which PostgreSQL cannot store"}
	}
	if !utf8.ValidString(s) {
		return &DecodeError{Code: CodeInvalidUTF8, Reason: "text is not valid UTF-8"}
	}
	return nil
}

func wrongType(t Type, got string) *DecodeError {
	return &DecodeError{Code: CodeWrongType, Reason: "a " + string(t) + " column cannot take " + got}
}

func invalidFormat(t Type, want string) *DecodeError {
	return &DecodeError{Code: CodeInvalidFormat, Reason: "value is not a valid " + string(t) + ": " + want}
}

func outOfRange(t Type, detail string) *DecodeError {
	r := "value is out of range for " + string(t)
	if detail != "" {
		r += ": " + detail
	}
	return &DecodeError{Code: CodeOutOfRange, Reason: r}
}

func nulInJSONB() *DecodeError {
	return &DecodeError{Code: CodeNULInText, Reason: `JSON contains \u0000, which PostgreSQL jsonb cannot store`}
}

// b2s views b as a string without copying; b must not change while the
// string is in use.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// s2bView views s as a byte slice without copying; the slice must not be
// modified.
func s2bView(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
