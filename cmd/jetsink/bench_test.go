package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// --set and --matrix go to the jetsink subprocess only: the keys the bench
// sets itself are usage errors that say what to use, before any server
// starts, and a URL's password is not repeated.
func TestBenchRejectsKeysItOwns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"--set", "postgres.url=postgres://u:s3cret@db/x"}, "--set postgres.url: the bench sets this key itself (--set goes to jetsink only): use --database-url"},
		{[]string{"--set", "nats.url=nats://h:4222"}, "use --nats-url"},
		{[]string{"--set", "pipeline.workers=2", "--set", " nats.stream =S"}, "--set nats.stream: the bench sets this key itself"},
		{[]string{"--set", "postgres.table=t"}, "a table of its own"},
		{[]string{"--set", "nats.consumer=c"}, "durable consumer"},
		{[]string{"--matrix", "postgres.table=a,b"}, "--matrix postgres.table: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_POSTGRES_URL=postgres://u:s3cret@db/x"}, "--matrix postgres.url: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_DATABASE_URL=postgres://u:s3cret@db/x"}, "--matrix postgres.url: the bench sets this key itself"},
		{[]string{"--matrix", "env:JETSINK_NATS_STREAM=A,B"}, "--matrix nats.stream: the bench sets this key itself"},
	} {
		r := startJetsink(t, ctx, append([]string{"bench", "-q"}, tc.args...)...)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != exitConfig || !strings.Contains(msg, tc.say) || strings.Contains(msg, "s3cret") || strings.Contains(msg, "embedded NATS") {
			t.Errorf("bench %v: exit %d, want %d with %q in:\n%s", tc.args, code, exitConfig, tc.say, msg)
		}
	}
}
