package pipeline

import "strings"

// Type is a column's PostgreSQL type as named in the config.
type Type string

// The supported column types.
const (
	TypeText        Type = "text"
	TypeUUID        Type = "uuid"
	TypeInt2        Type = "int2"
	TypeInt4        Type = "int4"
	TypeInt8        Type = "int8"
	TypeFloat4      Type = "float4"
	TypeFloat8      Type = "float8"
	TypeNumeric     Type = "numeric"
	TypeBool        Type = "bool"
	TypeTimestamptz Type = "timestamptz"
	TypeDate        Type = "date"
	TypeJSONB       Type = "jsonb"
	TypeBytea       Type = "bytea"
)

// Column maps one value of an event to one column of the table.
type Column struct {
	Name     string // column name, always used as a quoted identifier
	From     string // payload | meta:<field> | header:<Name> | json:<dotted.path> | /json/pointer
	Type     Type
	Required bool // a missing or null value dead-letters the event instead of storing NULL
}

// MayBeNull reports whether the column can get SQL NULL: it is not
// required, and its source may be missing from an event (a json: path or
// pointer, a header, meta:msg_id), or it is a jsonb payload column, NULL
// for a NATS KV bucket's delete or purge marker (a text or bytea one
// stores the marker's empty body). A column's DEFAULT never applies: the
// COPY names every mapped column.
func (c Column) MayBeNull() bool {
	if c.Required {
		return false
	}
	f := c.From
	return strings.HasPrefix(f, "json:") || strings.HasPrefix(f, "/") || strings.HasPrefix(f, "header:") || f == "meta:msg_id" ||
		f == "payload" && c.Type == TypeJSONB
}
