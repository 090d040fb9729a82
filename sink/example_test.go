package sink_test

import (
	"context"
	"fmt"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
)

func ExampleParseTable() {
	for _, s := range []string{"events", `analytics."Events.2026"`, `x"; drop table y; --`, "a..b"} {
		id, err := sink.ParseTable(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(id.Sanitize())
	}
	// Output:
	// "events"
	// "analytics"."Events.2026"
	// "x""; drop table y; --"
	// error: invalid postgres config: postgres.table "a..b" has an empty part; use table or schema.table (quote a part with " to keep a dot in it)
}

type noDL struct{}

func (noDL) DeadLetter(context.Context, *pipeline.Event, pipeline.DeadLetter) error { return nil }

func ExampleSink_DDL() {
	cfg := sink.DefaultConfig()
	cfg.Table = "app.events"
	cfg.Mode = sink.ExactlyOnce
	cols := []pipeline.Column{
		{Name: "id", From: "json:id", Type: pipeline.TypeUUID, Required: true},
		{Name: "stream", From: "meta:stream", Type: pipeline.TypeText, Required: true},
		{Name: "seq", From: "meta:stream_seq", Type: pipeline.TypeInt8, Required: true},
		{Name: "body", From: "payload", Type: pipeline.TypeJSONB},
	}
	s, err := sink.New(context.Background(), cfg, cols, noDL{}, nil) // connects lazily
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for _, q := range s.DDL() {
		fmt.Println(q + ";")
	}
	// Output:
	// CREATE TABLE IF NOT EXISTS "app"."events" (
	// 	"id" uuid NOT NULL,
	// 	"stream" text NOT NULL,
	// 	"seq" bigint NOT NULL,
	// 	"body" jsonb
	// );
	// CREATE UNIQUE INDEX IF NOT EXISTS "events_stream_seq_key" ON "app"."events" ("stream", "seq");
}
