package pipeline

// This file keeps the fastjson-based encoder that AppendTuple replaced, as
// the oracle of FuzzScanMatchesFastjson and BenchmarkJSONLibraries/fastjson:
// validate with utf8.Valid + fastjson.Validate + scanEscapes, parse with
// fastjson, look paths up with Value.Get. It must give the same tuple, or
// the same error, as AppendTuple for every input.
//
// One change from the old code: refGet, not fastjson's Value.Get, looks
// the paths up. Get compares an object's raw keys first, so in
// {"id":1,"\u0069d":2} json:id read 1, against the documented rule that the
// last of duplicate keys wins (the first won until session 28); refGet (and
// the scanner) read 2. And one
// check was added: a raw control character in a string that also holds an
// escape ("\x01\\n"), which fastjson.Validate let through and PostgreSQL
// refuses, is invalid_json. And one later: brackets nested deeper than
// fastjson.MaxDepth are refused before fastjson.Validate runs (nestsDeeper),
// whose time and memory grow with the square of the depth.

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// refEncoder is the Encoder as it was before the scanner (see the top of
// this file).
type refEncoder struct {
	m             *Mapper
	maxEventBytes int64
	p             fastjson.Parser
	nul           bool   // the current payload holds a \u0000 escape
	bigNum        bool   // the current payload may hold a number beyond numeric's range
	scratch       []byte // a number's JSON text
	numBuf        []byte // throwaway output of numeric range checks
}

func newRefEncoder(m *Mapper, maxEventBytes int64) *refEncoder {
	return &refEncoder{m: m, maxEventBytes: maxEventBytes}
}

// AppendTuple is the old Encoder.AppendTuple.
func (e *refEncoder) AppendTuple(dst []byte, ev *Event) ([]byte, error) {
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
			v := refGet(root, c.path)
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
		if dst, derr = endField(dst, at, c, derr); derr != nil {
			return dst[:start], derr
		}
	}
	return dst, nil
}

// parse checks that data is JSON PostgreSQL would accept and parses it.
func (e *refEncoder) parse(data []byte) (*fastjson.Value, *DecodeError) {
	if !utf8.Valid(data) {
		return nil, &DecodeError{Code: CodeInvalidUTF8, Reason: "payload is not valid UTF-8"}
	}
	if nestsDeeper(data, fastjson.MaxDepth) { // added after the scanner: fastjson.Validate is quadratic in the depth
		return nil, nestingError("payload")
	}
	// fastjson's parser is lenient (NaN, raw control characters, bad
	// escapes); its validator is strict, so run it first.
	if err := fastjson.ValidateBytes(data); err != nil {
		return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload is not valid JSON: " + trimTail(err.Error())}
	}
	if rawControlInString(data) { // added with the scanner: fastjson.Validate misses it
		return nil, rawControlError()
	}
	if bytes.IndexByte(data, '\\') >= 0 {
		nul, ok := scanEscapes(data)
		if !ok {
			return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload has a lone UTF-16 surrogate escape"}
		}
		e.nul = nul
	}
	e.bigNum = len(data) > numericMaxDScale || refMayHaveExponent(data)
	root, err := e.p.ParseBytes(data)
	if err != nil { // nesting deeper than fastjson.MaxDepth
		return nil, &DecodeError{Code: CodeInvalidJSON, Reason: "payload is not valid JSON: " + trimTail(err.Error())}
	}
	return root, nil
}

// appendJSONValue encodes a non-null JSON value as type t.
func (e *refEncoder) appendJSONValue(dst []byte, t Type, v *fastjson.Value) ([]byte, *DecodeError) {
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
			dst, _ = refAppendJSON(dst, v)
			return dst, nil
		case TypeJSONB:
			if e.bigNum && !e.numbersFit(v) {
				return dst, jsonbNumberRange()
			}
			var nul bool
			dst, nul = refAppendJSON(append(dst, 1), v)
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
func refMayHaveExponent(b []byte) bool {
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
func (e *refEncoder) numbersFit(v *fastjson.Value) bool {
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

// appendPayload encodes the whole payload as type t.
func (e *refEncoder) appendPayload(dst []byte, t Type, data []byte, root *fastjson.Value) ([]byte, *DecodeError) {
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

// appendJSON writes v as compact JSON. nul reports a string (or key) that
// holds a NUL character, which jsonb cannot store.
func refAppendJSON(dst []byte, v *fastjson.Value) (out []byte, nul bool) {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		dst = append(dst, '{')
		first := true
		o.Visit(func(k []byte, vv *fastjson.Value) {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			nul = nul || refHasNUL(k)
			dst = appendJSONString(dst, b2s(k))
			dst = append(dst, ':')
			var n bool
			dst, n = refAppendJSON(dst, vv)
			nul = nul || n
		})
		return append(dst, '}'), nul
	case fastjson.TypeArray:
		a, _ := v.Array()
		dst = append(dst, '[')
		for i, vv := range a {
			if i > 0 {
				dst = append(dst, ',')
			}
			var n bool
			dst, n = refAppendJSON(dst, vv)
			nul = nul || n
		}
		return append(dst, ']'), nul
	case fastjson.TypeString:
		sb, _ := v.StringBytes()
		return appendJSONString(dst, b2s(sb)), refHasNUL(sb)
	default: // number, true, false, null: MarshalTo writes their JSON text
		return v.MarshalTo(dst), false
	}
}

func refHasNUL(b []byte) bool {
	for _, c := range b {
		if c == 0 {
			return true
		}
	}
	return false
}

// refGet is fastjson's Value.Get with the last of duplicate keys winning
// after unescaping, as the package documents.
func refGet(v *fastjson.Value, path []string) *fastjson.Value {
	for _, key := range path {
		switch v.Type() {
		case fastjson.TypeObject:
			o, _ := v.Object()
			var found *fastjson.Value
			o.Visit(func(k []byte, vv *fastjson.Value) {
				if string(k) == key {
					found = vv
				}
			})
			if found == nil {
				return nil
			}
			v = found
		case fastjson.TypeArray:
			a, _ := v.Array()
			n, err := strconv.Atoi(key)
			if err != nil || n < 0 || n >= len(a) {
				return nil
			}
			v = a[n]
		default:
			return nil
		}
	}
	return v
}

// rawControlInString reports whether a string of the JSON text b (valid
// as fastjson.Validate has it) holds a raw control character.
func rawControlInString(b []byte) bool {
	in := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			in = !in
		case c == '\\' && in:
			i++
		case c < 0x20 && in:
			return true
		}
	}
	return false
}

func rawControlError() *DecodeError {
	return &DecodeError{Code: CodeInvalidJSON, Reason: "payload is not valid JSON: a string holds a raw control character"}
}
