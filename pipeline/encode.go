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
// tuples: the payload scanner's results and scratch space. It is not safe
// for concurrent use; give each worker its own (Mapper.NewEncoder). After
// the first few events an Encoder allocates nothing on the success path.
type Encoder struct {
	m             *Mapper
	maxEventBytes int64
	vals          []jsonValue // per path node: the value scan found there
	nul           bool        // the current payload holds a \u0000 escape
	badNums       []span      // numbers of the current payload beyond numeric's range
	fail          failKind    // why the last scanText refused its text
	failAt        int         // and where
	strBuf        []byte      // an unescaped string value
	keyBuf        []byte      // an unescaped key or string inside appendCompact
}

// NewEncoder returns an Encoder for m. Payloads longer than maxEventBytes
// fail with CodeTooLarge; 0 or less means no limit.
func (m *Mapper) NewEncoder(maxEventBytes int64) *Encoder {
	return &Encoder{m: m, maxEventBytes: maxEventBytes, vals: make([]jsonValue, len(m.nodes))}
}

// keepBuf is the most an Encoder keeps of a buffer it grew for one event:
// a worker lives as long as the process, and one event near
// max_event_bytes would otherwise hold a few times that per worker for
// good.
const keepBuf = 256 << 10

// dropBufs lets the garbage collector have the buffers an outlier grew.
func (e *Encoder) dropBufs() {
	e.strBuf, e.keyBuf, e.badNums = nil, nil, nil
}

// isNull is the internal marker a value encoder returns for SQL NULL.
var isNull = &DecodeError{Code: "null"}

// AppendTuple appends ev as one binary COPY tuple to dst and returns the
// extended slice. On failure it returns dst unchanged (same length) and a
// *DecodeError naming the column and the reason; the event should then be
// dead-lettered. Nothing of ev is retained.
func (e *Encoder) AppendTuple(dst []byte, ev *Event) ([]byte, error) {
	if max(cap(e.strBuf), cap(e.keyBuf)) > keepBuf || cap(e.badNums) > keepBuf/8 {
		e.dropBufs()
	}
	m := e.m
	data := ev.Data
	if e.maxEventBytes > 0 && int64(len(data)) > e.maxEventBytes {
		return dst, &DecodeError{Code: CodeTooLarge, Reason: "payload is " + strconv.Itoa(len(data)) +
			" bytes; max_event_bytes is " + strconv.FormatInt(e.maxEventBytes, 10)}
	}
	kvOp := ""
	if m.needJSON && !e.scan(data) {
		// A KV delete or purge marker reads as JSON null: every json:
		// path is missing (scan cleared e.vals and found nothing in the
		// empty text), and a jsonb payload is NULL (appendPayload).
		if len(data) == 0 {
			kvOp = kvDeletion(ev)
		}
		if kvOp == "" {
			return dst, e.scanError(data)
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
			v := e.value(c.node)
			if v.kind == kindAbsent || v.kind == kindNull {
				derr = isNull
				break
			}
			dst, derr = e.appendJSONValue(dst, c.Type, data, v)
		case srcPayload:
			dst, derr = e.appendPayload(dst, c.Type, data)
		case srcHeader:
			v, ok := ev.HeaderLookup(c.path[0])
			if !ok {
				derr = isNull
				break
			}
			dst, derr = appendString(dst, c.Type, v, false)
		default:
			dst, derr = appendMeta(dst, c, ev)
		}
		if dst, derr = endField(dst, at, c, derr); derr != nil {
			if kvOp != "" && derr.Code == CodeRequiredMissing && (c.src == srcJSON || c.src == srcPayload) {
				derr.Reason += "; the event is a KV " + kvOp + " marker (header " + kvOperation + ": " + kvOp + ", no body)"
			}
			return dst[:start], derr
		}
	}
	return dst, nil
}

// kvOperation is the header a NATS KV bucket's delete and purge markers
// carry (nats.go jetstream/kv.go: kvop), with the values kvDel and
// kvPurge, on an empty body.
const (
	kvOperation = "KV-Operation"
	kvDel       = "DEL"
	kvPurge     = "PURGE"
)

// kvDeletion returns the KV-Operation of ev, an event with an empty body,
// when it is a KV delete or purge marker (DEL or PURGE, the header's
// first value, matched exactly as a header: column reads it), else "".
// A put of an empty value carries no such header (nats.go publishes the
// value alone) and is no marker.
func kvDeletion(ev *Event) string {
	switch op, _ := ev.HeaderLookup(kvOperation); op {
	case kvDel, kvPurge:
		return op
	}
	return ""
}

// endField ends column c's field, whose 4-byte length starts at at: SQL
// NULL when the value encoder said isNull (an error if c is required), its
// length otherwise. A non-nil error is named for c; the caller drops the
// tuple then.
func endField(dst []byte, at int, c *column, derr *DecodeError) ([]byte, *DecodeError) {
	switch {
	case derr == isNull:
		if c.Required {
			return dst, &DecodeError{Column: c.Name, Code: CodeRequiredMissing,
				Reason: "value of " + c.From + " is missing or null and the column is required"}
		}
		return binary.BigEndian.AppendUint32(dst[:at], math.MaxUint32), nil // -1: NULL
	case derr != nil:
		derr.Column = c.Name
		return dst, derr
	}
	n := len(dst) - at - 4
	if n > math.MaxInt32 {
		return dst, &DecodeError{Column: c.Name, Code: CodeTooLarge, Reason: "value exceeds 2 GiB"}
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(n))
	return dst, nil
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
	r, _ := unhex4(b, 0)
	return r
}

// stringValue returns the text of the string v of data, unescaped.
func (e *Encoder) stringValue(data []byte, v jsonValue) string {
	if !v.esc {
		return b2s(data[v.start:v.end])
	}
	e.strBuf = appendUnescaped(e.strBuf[:0], data[v.start:v.end])
	return b2s(e.strBuf)
}

// appendJSONValue encodes v, a non-null value of data, as type t.
func (e *Encoder) appendJSONValue(dst []byte, t Type, data []byte, v jsonValue) ([]byte, *DecodeError) {
	switch v.kind {
	case kindString:
		s := e.stringValue(data, v)
		if t == TypeText && !e.nul {
			// The payload passed the scan, so s is valid UTF-8, and
			// without a \u0000 escape it holds no NUL.
			return append(dst, s...), nil
		}
		return appendString(dst, t, s, true)
	case kindNumber:
		num := data[v.start:v.end]
		switch t {
		case TypeText:
			return append(dst, num...), nil // the number's JSON text
		case TypeJSONB:
			if !e.numbersFit(v.start, v.end) {
				return dst, jsonbNumberRange()
			}
			return append(append(dst, 1), num...), nil
		case TypeInt2, TypeInt4, TypeInt8, TypeFloat4, TypeFloat8, TypeNumeric:
			return appendNumber(dst, t, b2s(num), true)
		}
		return dst, wrongType(t, "a number")
	case kindTrue, kindFalse:
		b := v.kind == kindTrue
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
		raw := data[v.start:v.end]
		switch t {
		case TypeText:
			return e.appendCompact(dst, raw), nil
		case TypeJSONB:
			if !e.numbersFit(v.start, v.end) {
				return dst, jsonbNumberRange()
			}
			if e.nul {
				if nul, _ := scanEscapes(raw); nul {
					return dst, nulInJSONB()
				}
			}
			return e.appendCompact(append(dst, 1), raw), nil
		}
		if v.kind == kindObject {
			return dst, wrongType(t, "an object")
		}
		return dst, wrongType(t, "an array")
	}
}

func jsonbNumberRange() *DecodeError {
	return &DecodeError{Code: CodeOutOfRange, Reason: "a JSON number is beyond the range of numeric, in which PostgreSQL jsonb stores numbers"}
}

// appendPayload encodes the whole payload as type t.
func (e *Encoder) appendPayload(dst []byte, t Type, data []byte) ([]byte, *DecodeError) {
	switch t {
	case TypeJSONB:
		// The payload passed the scan (a jsonb payload column makes the
		// Mapper need JSON), so its text is what jsonb's input takes, or
		// it is the empty body of a KV delete or purge marker, which
		// AppendTuple let by as JSON null: SQL NULL, not jsonb 'null'.
		if len(data) == 0 {
			return dst, isNull
		}
		if e.nul {
			return dst, nulInJSONB()
		}
		if len(e.badNums) > 0 {
			return dst, jsonbNumberRange()
		}
		return append(append(dst, 1), data...), nil
	case TypeText:
		if !e.m.needJSON { // else the scan found valid UTF-8 and no NUL byte
			if derr := checkText(b2s(data)); derr != nil {
				return dst, derr
			}
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
		return appendUint(dst, c.Type, uint64(ev.Delivered))
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
	// Rounded to the nearest microsecond (a half away from zero), not
	// truncated: PostgreSQL's input rounds the same instant given as text
	// too (the column of type text shows it to the nanosecond), though
	// its ties go by the binary value of the fraction.
	us := tm.Round(time.Microsecond).UnixMicro() - pgEpochMicros
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
		if v, ok := parseBool(s); ok {
			return append(dst, v), nil
		}
		return dst, invalidFormat(t, `want "true" or "false" (or another form PostgreSQL's bool reads: "t", "yes", "on", "1", ...)`)
	case TypeTimestamptz:
		us, derr := parseTimestamp(s)
		if derr != nil {
			return dst, derr
		}
		return binary.BigEndian.AppendUint64(dst, uint64(us)), nil
	case TypeDate:
		d, ok := parseDate(s)
		if !ok {
			return dst, badDate(s)
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
	if nestsDeeper(s2bView(s), fastjson.MaxDepth) {
		return dst, nestingError("value")
	}
	// Then the scanner, recording nothing (node -1) but its verdict; at
	// depth 0, so that what nestsDeeper lets by, a value inside 300 arrays,
	// is taken as it was (fastjson.Validate has no depth limit) and as
	// PostgreSQL takes it.
	var sc Encoder
	if !sc.scanText(s2bView(s), -1, 0) {
		return dst, sc.refusal(s2bView(s), "value")
	}
	if sc.nul {
		return dst, nulInJSONB()
	}
	if !textNumbersFit(s) {
		return dst, jsonbNumberRange()
	}
	return append(append(dst, 1), s...), nil
}

// textNumbersFit reports whether every number of the JSON text s (valid)
// fits numeric, as jsonb needs; like scanNumber it checks only numbers with
// an exponent or of 64 characters or more.
func textNumbersFit(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			for i++; s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case c == '-' || isDigit(c):
			j, exp := i+1, false
			for ; j < len(s) && (isDigit(s[j]) || strings.IndexByte("+-.eE", s[j]) >= 0); j++ {
				exp = exp || s[j] == 'e' || s[j] == 'E'
			}
			if (exp || j-i >= 64) && !numericFits(s[i:j]) {
				return false
			}
			i = j - 1
		}
	}
	return true
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
	a := "a " // a uuid, a text, ...
	if t == TypeInt2 || t == TypeInt4 || t == TypeInt8 {
		a = "an "
	}
	return &DecodeError{Code: CodeWrongType, Reason: a + string(t) + " column cannot take " + got}
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
