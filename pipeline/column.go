package pipeline

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
