package pipeline

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidMapping is wrapped by every error Compile returns: the column
// list cannot be turned into a Mapper.
var ErrInvalidMapping = errors.New("invalid column mapping")

// ColumnError is Compile's error for one column at fault: its index in the
// list (from 0), its name, and what is wrong with it and how to fix it. It
// wraps ErrInvalidMapping.
type ColumnError struct {
	Index  int
	Name   string
	Reason string
}

func (e *ColumnError) Error() string {
	return fmt.Sprintf("%v: column %d (%q): %s", ErrInvalidMapping, e.Index, e.Name, e.Reason)
}

func (e *ColumnError) Unwrap() error { return ErrInvalidMapping }

// sourceKind says where a column's value comes from.
type sourceKind uint8

const (
	srcPayload sourceKind = iota + 1
	srcJSON
	srcHeader
	srcMetaStream
	srcMetaStreamSeq
	srcMetaConsumerSeq
	srcMetaSubject
	srcMetaPublished
	srcMetaReceived
	srcMetaDelivered
	srcMetaMsgID
)

// metaSources maps the names after "meta:" to their source kinds.
var metaSources = map[string]sourceKind{
	"stream":       srcMetaStream,
	"stream_seq":   srcMetaStreamSeq,
	"consumer_seq": srcMetaConsumerSeq,
	"subject":      srcMetaSubject,
	"published_at": srcMetaPublished,
	"received_at":  srcMetaReceived,
	"delivered":    srcMetaDelivered,
	"msg_id":       srcMetaMsgID,
}

// allTypes lists every supported type, in the order the docs name them.
var allTypes = []Type{
	TypeText, TypeUUID, TypeInt2, TypeInt4, TypeInt8, TypeFloat4, TypeFloat8,
	TypeNumeric, TypeBool, TypeTimestamptz, TypeDate, TypeJSONB, TypeBytea,
}

// compatible lists the types each source kind can fill. JSON values and
// headers can fill every type; the checks that remain happen per event.
var compatible = map[sourceKind][]Type{
	srcPayload:         {TypeJSONB, TypeBytea, TypeText},
	srcJSON:            allTypes,
	srcHeader:          allTypes,
	srcMetaStream:      {TypeText},
	srcMetaSubject:     {TypeText},
	srcMetaMsgID:       {TypeText, TypeUUID},
	srcMetaStreamSeq:   {TypeInt8, TypeNumeric, TypeText},
	srcMetaConsumerSeq: {TypeInt8, TypeNumeric, TypeText},
	srcMetaDelivered:   {TypeInt2, TypeInt4, TypeInt8, TypeNumeric, TypeText},
	srcMetaPublished:   {TypeTimestamptz, TypeText},
	srcMetaReceived:    {TypeTimestamptz, TypeText},
}

// column is a compiled Column.
type column struct {
	Column
	src  sourceKind
	path []string // srcJSON: object keys / array indexes; srcHeader: path[0] is the header name
	node int32    // srcJSON: the path's last node in Mapper.nodes
}

// Mapper turns events into binary COPY tuples for a fixed list of columns.
// A Mapper is immutable and safe for concurrent use; the per-goroutine
// state lives in an Encoder (see NewEncoder).
type Mapper struct {
	cols        []column
	pub         []Column
	needJSON    bool       // some column reads the JSON payload, so it must be valid JSON
	jsonbNums   bool       // a jsonb column takes JSON from the payload: numbers beyond numeric's range matter
	payloadCols int        // how many columns store the whole payload
	nodes       []pathNode // the json: paths as a trie, for the scanner
}

// tupleCap is room, most likely enough, for the tuple of an event of n
// payload bytes when the mapping stores the payload, and 0 when it does
// not (the tuple's size then says little of the payload's). An estimate:
// headers and metadata may take more, and the tuple grows then.
func (m *Mapper) tupleCap(n int) int {
	if m.payloadCols == 0 {
		return 0
	}
	return 2 + len(m.cols)*(4+64) + m.payloadCols*(n+1)
}

// RawColumns returns the raw-mode mapping used when the config lists no
// columns: stream text, stream_seq int8, subject text, published_at
// timestamptz, received_at timestamptz, msg_id text, payload jsonb.
func RawColumns() []Column {
	return []Column{
		{Name: "stream", From: "meta:stream", Type: TypeText, Required: true},
		{Name: "stream_seq", From: "meta:stream_seq", Type: TypeInt8, Required: true},
		{Name: "subject", From: "meta:subject", Type: TypeText, Required: true},
		{Name: "published_at", From: "meta:published_at", Type: TypeTimestamptz},
		{Name: "received_at", From: "meta:received_at", Type: TypeTimestamptz},
		{Name: "msg_id", From: "meta:msg_id", Type: TypeText},
		{Name: "payload", From: "payload", Type: TypeJSONB, Required: true},
	}
}

// Compile checks cols and returns a Mapper for them. An empty list is an
// error; callers that want raw mode pass RawColumns(). Every error wraps
// ErrInvalidMapping; one that a column causes is a *ColumnError, which names
// the column's index and name and how to fix it, and a list with several
// columns at fault returns one per column, joined (errors.Join).
func Compile(cols []Column) (*Mapper, error) {
	if len(cols) == 0 {
		return nil, fmt.Errorf("%w: no columns; list at least one, or use the raw-mode columns", ErrInvalidMapping)
	}
	if len(cols) > 1600 {
		// PostgreSQL's MaxTupleAttributeNumber; also keeps the int16 field count valid.
		return nil, fmt.Errorf("%w: %d columns; PostgreSQL allows at most 1600 per table", ErrInvalidMapping, len(cols))
	}
	m := &Mapper{cols: make([]column, len(cols)), pub: append([]Column(nil), cols...)}
	seen := make(map[string]int, len(cols))
	var errs []error // one per column at fault, so that one attempt shows them all
	for i, c := range cols {
		if err := m.compile(i, c, seen); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// maxIdentifierBytes is the longest name PostgreSQL keeps whole.
const maxIdentifierBytes = 63

// compile checks column i, c, and sets m.cols[i]; seen maps the names of
// the columns before it to their indexes. An error names the column's
// first problem.
func (m *Mapper) compile(i int, c Column, seen map[string]int) error {
	bad := func(format string, args ...any) error {
		return &ColumnError{Index: i, Name: c.Name, Reason: fmt.Sprintf(format, args...)}
	}
	if c.Name == "" {
		return bad("name is empty; give every column a name")
	}
	if strings.IndexByte(c.Name, 0) >= 0 {
		return bad("name contains a NUL byte")
	}
	if len(c.Name) > maxIdentifierBytes {
		// Two such names alike in their first 63 bytes would name one
		// column twice in COPY, and init would make a column that check
		// then could not find.
		return bad("name is %d bytes; PostgreSQL cuts names to %d bytes (NAMEDATALEN-1), so the table's column would be called otherwise", len(c.Name), maxIdentifierBytes)
	}
	if j, dup := seen[c.Name]; dup {
		return bad("name is already used by column %d; column names must be unique", j)
	}
	seen[c.Name] = i
	if !validType(c.Type) {
		return bad("unknown type %q; use one of %s", c.Type, typeList(allTypes))
	}
	cc := column{Column: c}
	switch from := c.From; {
	case from == "payload":
		cc.src = srcPayload
		m.payloadCols++
	case strings.HasPrefix(from, "meta:"):
		k, ok := metaSources[from[len("meta:"):]]
		if !ok {
			return bad("unknown source %q; meta: takes one of stream, stream_seq, consumer_seq, subject, published_at, received_at, delivered, msg_id", from)
		}
		cc.src = k
	case strings.HasPrefix(from, "header:"):
		name := from[len("header:"):]
		if name == "" {
			return bad("source %q names no header; write header:<Name>", from)
		}
		if strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == ':' || r >= 0x7f }) >= 0 {
			// A NATS header line is "Name: value": a name with a colon,
			// white space or a control character is none any publisher
			// can send, and the column would be NULL for ever.
			return bad("source %q: a header name has no white space, ':' or control characters (header:X-Id, case as sent)", from)
		}
		cc.src, cc.path = srcHeader, []string{name}
	case strings.HasPrefix(from, "json:"):
		p := from[len("json:"):]
		parse := parseDotted
		if strings.HasPrefix(p, "/") { // json:/a/b is the pointer /a/b, not the key "/a/b"
			parse = parsePointer
		}
		path, err := parse(p)
		if err != nil {
			return bad("source %q: %v", from, err)
		}
		cc.src, cc.path = srcJSON, path
		m.nodes, cc.node = addPath(m.nodes, path)
	case strings.HasPrefix(from, "/"):
		path, err := parsePointer(from)
		if err != nil {
			return bad("source %q: %v", from, err)
		}
		cc.src, cc.path = srcJSON, path
		m.nodes, cc.node = addPath(m.nodes, path)
	case from == "":
		return bad("source is empty; set from to payload, meta:<field>, header:<Name>, json:<dotted.path> or a JSON pointer like /a/b")
	default:
		return bad("unknown source %q; use payload, meta:<field>, header:<Name>, json:<dotted.path> or a JSON pointer like /a/b", from)
	}
	if ok := typeIn(c.Type, compatible[cc.src]); !ok {
		return bad("source %q cannot fill a column of type %s; use one of %s", c.From, c.Type, typeList(compatible[cc.src]))
	}
	if cc.src == srcJSON || (cc.src == srcPayload && c.Type == TypeJSONB) {
		m.needJSON = true
		m.jsonbNums = m.jsonbNums || c.Type == TypeJSONB
		if len(m.nodes) == 0 {
			m.nodes = append(m.nodes, pathNode{idx: -1, maxIdx: -1, parent: -1}) // the scanner's root
		}
	}
	m.cols[i] = cc
	return nil
}

// Columns returns a copy of the columns the Mapper was compiled from, in
// tuple order.
func (m *Mapper) Columns() []Column { return append([]Column(nil), m.pub...) }

// parseDotted splits a json: path such as "tags.site" or "items.0.id".
// Keys that contain dots need a JSON pointer instead.
func parseDotted(p string) ([]string, error) {
	if p == "" {
		return nil, errors.New("empty path; write json:<key> or json:<a.b.c>")
	}
	parts := strings.Split(p, ".")
	for _, k := range parts {
		if k == "" {
			return nil, errors.New("empty key in dotted path; for keys with dots or empty keys use a JSON pointer like /a.b/c")
		}
	}
	return parts, nil
}

// parsePointer parses an RFC 6901 JSON pointer ("/a/b~1c/0"). The empty
// pointer (the whole document) is not accepted: use payload for that.
func parsePointer(p string) ([]string, error) {
	parts := strings.Split(p[1:], "/")
	for i, k := range parts {
		if !strings.Contains(k, "~") {
			continue
		}
		var b strings.Builder
		for j := 0; j < len(k); j++ {
			if k[j] != '~' {
				b.WriteByte(k[j])
				continue
			}
			if j+1 >= len(k) || (k[j+1] != '0' && k[j+1] != '1') {
				return nil, errors.New(`bad escape in JSON pointer; "~" must be followed by 0 (for ~) or 1 (for /)`)
			}
			if k[j+1] == '0' {
				b.WriteByte('~')
			} else {
				b.WriteByte('/')
			}
			j++
		}
		parts[i] = b.String()
	}
	return parts, nil
}

func validType(t Type) bool { return typeIn(t, allTypes) }

func typeIn(t Type, ts []Type) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

func typeList(ts []Type) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ", ")
}
