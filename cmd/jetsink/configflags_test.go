package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A shortcut flag given empty (--database-url "$DATABASE_URL" with the
// variable unset) is refused, naming the flag, by every command that has
// it: it does not fall back to the file's, the environment's or the
// default server.
func TestEmptyShortcutFlagIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const nowhere, pgNowhere = "nats://127.0.0.1:1", "postgres://127.0.0.1:1/x"
	for _, tc := range []struct {
		args []string
		say  string
	}{
		{[]string{"check", "--database-url=", "--nats-url", nowhere}, "postgres.url is empty; set it or JETSINK_DATABASE_URL (--database-url)"},
		{[]string{"run", "--database-url=", "--nats-url", nowhere}, "(--database-url)"},
		{[]string{"init", "--database-url=", "--nats-url", nowhere}, "(--database-url)"},
		{[]string{"check", "--nats-url=", "--database-url", pgNowhere}, "nats.url is empty"},
		{[]string{"check", "--stream=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--stream)"},
		{[]string{"check", "--table=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--table)"},
		{[]string{"check", "--mode=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--mode)"},
		{[]string{"check", "--log-level=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--log-level)"},
		{[]string{"publish", "--nats-url=", "--events", "1"}, "(--nats-url)"},
		{[]string{"dlq", "replay", "--nats-url=", "--dry-run"}, "(--nats-url)"},
		{[]string{"bench", "--database-url=", "--nats-url", nowhere, "--events", "1"}, "(--database-url)"},
	} {
		r := startJetsink(t, ctx, tc.args...)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != exitConfig || !strings.Contains(msg, tc.say) {
			t.Errorf("jetsink %s: exit %d, want %d with %q in:\n%s", strings.Join(tc.args, " "), code, exitConfig, tc.say, msg)
		}
	}
}
