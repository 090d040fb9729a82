package loadgen

import "github.com/jetsink/jetsink/pipeline"

// Columns maps the generated events to eight typed columns (uuid,
// timestamptz, text, text, float8, int8, text from a nested path, and the
// whole payload as jsonb) plus the (stream, stream_seq) key that
// exactly-once mode needs. demo, bench and the end-to-end tests use it.
func Columns() []pipeline.Column {
	return []pipeline.Column{
		{Name: "id", From: "json:id", Type: pipeline.TypeUUID, Required: true},
		{Name: "ts", From: "json:ts", Type: pipeline.TypeTimestamptz, Required: true},
		{Name: "device", From: "json:device", Type: pipeline.TypeText},
		{Name: "kind", From: "json:kind", Type: pipeline.TypeText},
		{Name: "value", From: "json:value", Type: pipeline.TypeFloat8},
		{Name: "seq", From: "json:seq", Type: pipeline.TypeInt8},
		{Name: "site", From: "json:tags.site", Type: pipeline.TypeText},
		{Name: "body", From: "payload", Type: pipeline.TypeJSONB},
		{Name: "stream", From: "meta:stream", Type: pipeline.TypeText},
		{Name: "stream_seq", From: "meta:stream_seq", Type: pipeline.TypeInt8},
	}
}
