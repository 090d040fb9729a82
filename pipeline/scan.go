package pipeline

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// This file holds the payload scanner: one pass over the bytes that checks
// everything PostgreSQL's jsonb input and the json: columns need (UTF-8,
// strict JSON as fastjson.Validate has it, no lone surrogate escapes,
// nesting within fastjson.MaxDepth), notes what later steps need (whether
// a \u0000 escape occurs, which numbers lie beyond numeric's range), and
// records where the values of the json: paths lie, so nothing is parsed
// twice and no tree is built. It accepts exactly what the fastjson-based
// checks it replaced accepted; refusal names why it refused a text.

// jsonKind is the kind of a JSON value the scanner found at a path.
type jsonKind uint8

const (
	kindAbsent jsonKind = iota // the path is not in the payload
	kindNull
	kindString
	kindNumber
	kindTrue
	kindFalse
	kindObject
	kindArray
)

// jsonValue locates a value in the payload: data[start:end] is the value's
// JSON text, except for strings, where it is the text between the quotes.
type jsonValue struct {
	start, end int
	kind       jsonKind
	esc        bool // a string with escapes, which must be unescaped
}

// pathNode is one step of the compiled json: paths. The nodes form a trie
// rooted at node 0; a column reads the value of its path's last node.
type pathNode struct {
	key      string           // object key this node stands for
	idx      int              // the array index key names (as fastjson's Get reads it), or -1
	maxIdx   int              // the largest idx among children, -1 if none: later elements of an array are no child's
	parent   int32            // -1 at the root
	children []int32          // node ids
	byKey    map[string]int32 // key -> position in children, for a node of more than byKeyMin children
}

// byKeyMin is the most children a node has before matchKey looks keys up
// in a map (pathNode.byKey) rather than comparing them with each child's.
const byKeyMin = 8

// addPath adds path to the trie and returns the id of its last node.
func addPath(nodes []pathNode, path []string) ([]pathNode, int32) {
	if len(nodes) == 0 {
		nodes = append(nodes, pathNode{idx: -1, maxIdx: -1, parent: -1})
	}
	cur := int32(0)
next:
	for _, k := range path {
		for _, c := range nodes[cur].children {
			if nodes[c].key == k {
				cur = c
				continue next
			}
		}
		idx, err := strconv.Atoi(k)
		if err != nil || idx < 0 {
			idx = -1
		}
		nodes = append(nodes, pathNode{key: k, idx: idx, maxIdx: -1, parent: cur})
		id := int32(len(nodes) - 1)
		p := &nodes[cur]
		p.children = append(p.children, id)
		p.maxIdx = max(p.maxIdx, idx)
		if len(p.children) > byKeyMin {
			if p.byKey == nil {
				p.byKey = make(map[string]int32, len(p.children))
				for j, c := range p.children {
					p.byKey[nodes[c].key] = int32(j)
				}
			}
			p.byKey[k] = int32(len(p.children) - 1)
		}
		cur = id
	}
	return nodes, cur
}

// span is a range of the payload.
type span struct{ start, end int }

// scan checks data and records the values of the Mapper's paths in e.vals,
// whether a \u0000 escape occurs (e.nul) and the numbers beyond numeric's
// range (e.badNums). It reports whether data is acceptable.
func (e *Encoder) scan(data []byte) bool {
	e.nul = false
	e.badNums = e.badNums[:0]
	clear(e.vals)
	return e.scanText(data, 0, 1)
}

// scanText scans the JSON text b from its root, node (-1: record no
// values), at depth (1 counts as fastjson's parser does; 0 lets a scalar
// sit inside fastjson.MaxDepth containers, which nestsDeeper allows), and
// on failure notes where and, for the failures refusal words itself, why
// (e.fail, e.failAt).
func (e *Encoder) scanText(b []byte, node int32, depth int) bool {
	e.fail = failSyntax
	i, ok := e.scanValue(b, skipWS(b, 0), node, depth)
	if ok {
		if i = skipWS(b, i); i == len(b) {
			return true
		}
	}
	e.failAt = i
	return false
}

// failKind is why the scanner refused a text, where refusal words it
// without fastjson: fastjson cannot tell the second and third from valid
// text, and for the first it quotes the rest of the text once per level of
// nesting (a 1 MiB payload took seconds and gigabytes to refuse, and its
// reason held the payload).
type failKind uint8

const (
	failSyntax    failKind = iota // anything else: fastjson words it
	failLiteral                   // a value starting with t, f or n is not true, false or null
	failControl                   // a raw control character in a string
	failSurrogate                 // a lone UTF-16 surrogate escape
	failDepth                     // nested deeper than fastjson.MaxDepth
)

// scanError names why scan refused data.
func (e *Encoder) scanError(data []byte) *DecodeError { return e.refusal(data, "payload") }

// refusal names why scanText refused b, a payload or a value (what). It
// checks UTF-8 first, then nesting deeper than fastjson.MaxDepth (see
// nestsDeeper); the failures the scanner noted it words itself, with the
// byte offset and nothing of the text; any other is a syntax error at the
// same place for fastjson, which the scanner agrees with on what it
// accepts (FuzzScanMatchesFastjson), and fastjson words it. The reason
// quotes at most the few characters of a bad escape or number, never the
// rest of the text.
func (e *Encoder) refusal(b []byte, what string) *DecodeError {
	if !utf8.Valid(b) {
		return &DecodeError{Code: CodeInvalidUTF8, Reason: what + " is not valid UTF-8"}
	}
	if nestsDeeper(b, fastjson.MaxDepth) {
		return nestingError(what)
	}
	at := " at byte " + strconv.Itoa(e.failAt)
	switch e.fail {
	case failLiteral:
		return &DecodeError{Code: CodeInvalidJSON, Reason: what + " is not valid JSON: a value that is not true, false or null" + at}
	case failControl:
		return &DecodeError{Code: CodeInvalidJSON, Reason: what + " is not valid JSON: a string holds a raw control character" + at}
	case failSurrogate:
		return &DecodeError{Code: CodeInvalidJSON, Reason: what + " has a lone UTF-16 surrogate escape" + at}
	case failDepth: // a value inside MaxDepth arrays and objects, which nestsDeeper lets by
		return nestingError(what)
	}
	if err := fastjson.ValidateBytes(b); err != nil {
		return &DecodeError{Code: CodeInvalidJSON, Reason: what + " is not valid JSON: " + innermost(trimTail(err.Error())) + at}
	}
	// Not reached while scan and fastjson agree (FuzzScanMatchesFastjson).
	return &DecodeError{Code: CodeInvalidJSON, Reason: what + " is not valid JSON" + at}
}

// innermost drops the "cannot parse array: " and like prefixes fastjson
// adds once per level of nesting around the error it met.
func innermost(msg string) string {
	for {
		trimmed := false
		for _, w := range [...]string{"cannot parse JSON: ", "cannot parse object: ", "cannot parse array: ",
			"cannot parse object value: ", "cannot parse array value: "} {
			if rest, ok := strings.CutPrefix(msg, w); ok {
				msg, trimmed = rest, true
			}
		}
		if !trimmed {
			return msg
		}
	}
}

// nestsDeeper reports whether the text b opens more than max arrays and
// objects at once outside strings; fastjson's parser refuses such JSON.
// Check it before fastjson.Validate, which has no depth limit and words
// its error once per level: on deep unbalanced input it takes time and
// memory quadratic in the depth (10 KB of "[" took 36 s and 9 GB).
func nestsDeeper(b []byte, max int) bool {
	depth, in := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case in:
			if c == '\\' {
				i++
			} else if c == '"' {
				in = false
			}
		case c == '"':
			in = true
		case c == '[' || c == '{':
			if depth++; depth > max {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// nestingError refuses what (payload or value) for nesting deeper than
// fastjson.MaxDepth.
func nestingError(what string) *DecodeError {
	return &DecodeError{Code: CodeInvalidJSON, Reason: what + " is not valid JSON: nested deeper than " + strconv.Itoa(fastjson.MaxDepth)}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// scanValue scans the value at b[i] (after white space), which node stands
// for (-1: none). depth counts as fastjson's parser does: 1 at the top.
func (e *Encoder) scanValue(b []byte, i int, node int32, depth int) (int, bool) {
	if depth > fastjson.MaxDepth {
		e.fail = failDepth
		return i, false
	}
	if i >= len(b) {
		return i, false
	}
	start := i
	var kind jsonKind
	switch b[i] {
	case '"':
		end, esc, ok := e.scanString(b, i+1)
		if node >= 0 {
			e.vals[node] = jsonValue{start: i + 1, end: end - 1, kind: kindString, esc: esc}
		}
		return end, ok
	case '{':
		return e.scanObject(b, i, node, depth)
	case '[':
		return e.scanArray(b, i, node, depth)
	case 't':
		if !bytes.HasPrefix(b[i:], []byte("true")) {
			e.fail = failLiteral
			return i, false
		}
		i, kind = i+4, kindTrue
	case 'f':
		if !bytes.HasPrefix(b[i:], []byte("false")) {
			e.fail = failLiteral
			return i, false
		}
		i, kind = i+5, kindFalse
	case 'n':
		if !bytes.HasPrefix(b[i:], []byte("null")) {
			e.fail = failLiteral
			return i, false
		}
		i, kind = i+4, kindNull
	default:
		var ok bool
		if i, ok = e.scanNumber(b, i); !ok {
			return i, false
		}
		kind = kindNumber
	}
	if node >= 0 {
		e.vals[node] = jsonValue{start: start, end: i, kind: kind}
	}
	return i, true
}

func (e *Encoder) scanObject(b []byte, i int, node int32, depth int) (int, bool) {
	start := i
	var kids []int32
	var byKey map[string]int32
	if node >= 0 {
		kids, byKey = e.m.nodes[node].children, e.m.nodes[node].byKey
	}
	next := 0 // the child in kids the next key most likely names
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			end, esc, ok := e.scanString(b, i+1)
			if !ok {
				return end, false
			}
			child := int32(-1)
			if len(kids) > 0 {
				if p := e.matchKey(kids, byKey, next, b[i+1:end-1], esc); p >= 0 {
					child, next = kids[p], p+1
				}
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return i, false
			}
			if i, ok = e.scanValue(b, skipWS(b, i+1), child, depth+1); !ok {
				return i, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, false
			}
			if b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if b[i] != '}' {
				return i, false
			}
			i++
			break
		}
	}
	if node >= 0 {
		e.vals[node] = jsonValue{start: start, end: i, kind: kindObject}
	}
	return i, true
}

func (e *Encoder) scanArray(b []byte, i int, node int32, depth int) (int, bool) {
	start := i
	var kids []int32
	maxIdx := -1
	if node >= 0 {
		kids, maxIdx = e.m.nodes[node].children, e.m.nodes[node].maxIdx
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		i++
	} else {
		for n := 0; ; n++ {
			child, more := int32(-1), false
			if n <= maxIdx { // else no child indexes this element or any after it
				for _, k := range kids {
					if e.m.nodes[k].idx == n {
						if child >= 0 {
							more = true
							break
						}
						child = k
					}
				}
			}
			at := i
			var ok bool
			if i, ok = e.scanValue(b, i, child, depth+1); !ok {
				return i, false
			}
			if more { // "1", "01" and "+1" are nodes of their own: scan the element again for each
				for _, k := range kids {
					if k != child && e.m.nodes[k].idx == n {
						e.scanValue(b, at, k, depth+1)
					}
				}
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, false
			}
			if b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if b[i] != ']' {
				return i, false
			}
			i++
			break
		}
	}
	if node >= 0 {
		e.vals[node] = jsonValue{start: start, end: i, kind: kindArray}
	}
	return i, true
}

// matchKey returns the position in kids of the child that key (a raw key,
// escaped when esc) names, or -1. It tries kids[next] first: keys tend to
// come in the order the columns name them; then byKey, the node's map of
// its children's keys when it has more than byKeyMin, else each child.
// A key met twice is matched twice: its later value is recorded over the
// earlier one's (see value for what was recorded under the earlier one).
func (e *Encoder) matchKey(kids []int32, byKey map[string]int32, next int, key []byte, esc bool) int {
	if esc {
		e.keyBuf = appendUnescaped(e.keyBuf[:0], key)
		key = e.keyBuf
	}
	nodes := e.m.nodes
	if next < len(kids) && nodes[kids[next]].key == string(key) {
		return next
	}
	if byKey != nil {
		if j, ok := byKey[string(key)]; ok { // string(key) does not allocate here
			return int(j)
		}
		return -1
	}
	for j, k := range kids {
		if nodes[k].key == string(key) {
			return j
		}
	}
	return -1
}

// value returns the value scan recorded for node, or a jsonValue of
// kindAbsent when the payload has none there.
//
// With duplicate keys the last one wins, as in PostgreSQL's jsonb,
// JavaScript's JSON.parse and Go's encoding/json, so that a column and the
// stored jsonb payload never disagree. The later occurrence's value is
// recorded over the earlier one's, but what was recorded under the
// earlier one stays in e.vals, stale: nothing is cleared when a key
// repeats, which would cost a repeated key as much as the mapping has
// paths under it. Staleness is told here instead, from the spans: a
// node's values at one depth of the payload never overlap, and a value
// lies inside its parent's, so a recorded value is current exactly when
// it lies inside its parent's current value, and that one inside its
// parent's, up to the root; and as an earlier occurrence of a key ends
// before the later one starts, so does everything under it, so the
// starts alone tell.
func (e *Encoder) value(node int32) jsonValue {
	v := e.vals[node]
	for c := v; c.kind != kindAbsent; {
		p := e.m.nodes[node].parent
		if p <= 0 { // the root occurs once: what lies in it is current
			return v
		}
		pv := e.vals[p]
		if c.start < pv.start { // recorded under an earlier occurrence of an ancestor
			break
		}
		node, c = p, pv
	}
	return jsonValue{}
}

// strClass sorts string bytes: 0 plain, 1 '"', 2 '\\', 3 control
// character, 4 the first byte of a multi-byte UTF-8 sequence (or junk).
var strClass = func() (t [256]uint8) {
	for c := range 0x20 {
		t[c] = 3
	}
	t['"'], t['\\'] = 1, 2
	for c := 0x80; c < 0x100; c++ {
		t[c] = 4
	}
	return t
}()

// scanString scans the rest of a string whose opening quote is at i-1 and
// returns the index after its closing quote; esc reports escapes.
func (e *Encoder) scanString(b []byte, i int) (end int, esc, ok bool) {
	for {
		i = skipPlain(b, i)
		if i >= len(b) {
			return i, esc, false
		}
		switch strClass[b[i]] {
		case 1:
			return i + 1, esc, true
		case 2:
			esc = true
			if i, ok = e.scanEscape(b, i); !ok {
				return i, esc, false
			}
		case 3:
			e.fail = failControl
			return i, esc, false
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, esc, false
			}
			i += size
		}
	}
}

// skipPlain returns the index of the first byte at or after b[i] that is
// not plain (strClass 0), or len(b). It tests eight bytes at a time: a
// byte is flagged when it is below 0x20, '"', '\\' or 0x80 and up; the
// borrows of the zero-byte test can flag bytes after a flagged one, never
// before it, so the lowest flag is exact.
func skipPlain(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		q, bs := x^(ones*'"'), x^(ones*'\\')
		m := ((x-ones*0x20)&^x | (q-ones)&^q | (bs-ones)&^bs | x) & highs
		if m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		i += 8
	}
	for i < len(b) && strClass[b[i]] == 0 {
		i++
	}
	return i
}

// scanEscape checks the escape at b[i] == '\\' and returns the index after
// it. A \u0000 sets e.nul; a surrogate escape must be a high one followed
// by a low one, as PostgreSQL's JSON parser demands.
func (e *Encoder) scanEscape(b []byte, i int) (int, bool) {
	if i+1 >= len(b) {
		return i, false
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, true
	case 'u':
		r, ok := unhex4(b, i+2)
		switch {
		case !ok:
			return i, false
		case r == 0:
			e.nul = true
		case r >= 0xD800 && r <= 0xDBFF:
			if i+8 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
				e.fail = failSurrogate
				return i, false
			}
			lo, ok := unhex4(b, i+8)
			if !ok { // a bad escape after it
				return i + 6, false
			}
			if lo < 0xDC00 || lo > 0xDFFF {
				e.fail = failSurrogate
				return i, false
			}
			return i + 12, true
		case r >= 0xDC00 && r <= 0xDFFF:
			e.fail = failSurrogate
			return i, false
		}
		return i + 6, true
	}
	return i, false
}

// unhexTab maps a hex digit to its value and anything else to 0xFF.
var unhexTab = func() (t [256]byte) {
	for c := range t {
		t[c] = 0xFF
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
		t[c-'a'+'A'] = c - 'a' + 10
	}
	return t
}()

// unhex4 decodes the four hex digits at b[i:].
func unhex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	h0, h1, h2, h3 := unhexTab[b[i]], unhexTab[b[i+1]], unhexTab[b[i+2]], unhexTab[b[i+3]]
	if (h0|h1|h2|h3)&0xF0 != 0 {
		return 0, false
	}
	return rune(h0)<<12 | rune(h1)<<8 | rune(h2)<<4 | rune(h3), true
}

func isDigit(c byte) bool { return c-'0' <= 9 }

// scanNumber scans the JSON number at b[i]. When a jsonb column takes JSON
// from the payload (Mapper.jsonbNums), a number with an exponent or of 64
// characters or more is checked against numeric's range, which jsonb
// stores numbers in; shorter ones without an exponent always fit.
func (e *Encoder) scanNumber(b []byte, i int) (int, bool) {
	start := i
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, false
	case b[i] == '0':
		i++
	case isDigit(b[i]):
		i++
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == d {
			return i, false
		}
	}
	exp := false
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		exp = true
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == d {
			return i, false
		}
	}
	if (exp || i-start >= 64) && e.m != nil && e.m.jsonbNums && !numericFits(b2s(b[start:i])) {
		e.badNums = append(e.badNums, span{start, i})
	}
	return i, true
}

// numbersFit reports whether every number in data[start:end] fits numeric.
func (e *Encoder) numbersFit(start, end int) bool {
	for _, s := range e.badNums {
		if s.start >= start && s.end <= end {
			return false
		}
	}
	return true
}

// appendUnescaped appends the text of the raw JSON string s (valid, with
// no lone surrogate escapes) to dst.
func appendUnescaped(dst, s []byte) []byte {
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		c := s[i+1]
		s = s[i+2:]
		switch c {
		case 'u':
			r, _ := unhex4(s, 0)
			s = s[4:]
			if utf16.IsSurrogate(r) {
				lo, _ := unhex4(s, 2)
				r = utf16.DecodeRune(r, lo)
				s = s[6:]
			}
			dst = utf8.AppendRune(dst, r)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
	}
}

// appendCompact appends the JSON text b (scanned) without white space and
// with every string written as appendJSONString writes it: the compact
// form that text and jsonb columns get for objects and arrays.
func (e *Encoder) appendCompact(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		switch c := b[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			j := i + 1
			esc := false
			for b[j] != '"' {
				if b[j] == '\\' {
					esc = true
					j++
				}
				j++
			}
			if esc {
				e.keyBuf = appendUnescaped(e.keyBuf[:0], b[i+1:j])
				dst = appendJSONString(dst, b2s(e.keyBuf))
			} else {
				dst = append(dst, b[i:j+1]...)
			}
			i = j + 1
		default:
			dst = append(dst, c)
			i++
		}
	}
	return dst
}
