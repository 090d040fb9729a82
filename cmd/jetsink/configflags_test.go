package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
		{[]string{"init", "--database-url="}, "(--database-url)"},
		{[]string{"check", "--nats-url=", "--database-url", pgNowhere}, "nats.url is empty"},
		{[]string{"check", "--stream=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--stream)"},
		{[]string{"check", "--table=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--table)"},
		{[]string{"check", "--mode=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--mode)"},
		{[]string{"check", "--log-level=", "--nats-url", nowhere, "--database-url", pgNowhere}, "(--log-level)"},
		{[]string{"publish", "--nats-url=", "--events", "1"}, "(--nats-url)"},
		{[]string{"dlq", "replay", "--nats-url=", "--dry-run"}, "(--nats-url)"},
		{[]string{"bench", "--database-url=", "--nats-url", nowhere, "--events", "1"}, "(--database-url)"},
		// --config "$CFG" with CFG unset read no file, and ran on the
		// defaults (and over JETSINK_CONFIG: below).
		{[]string{"check", "--config=", "--nats-url", nowhere, "--database-url", pgNowhere}, emptyConfig},
		{[]string{"run", "-c", "", "--nats-url", nowhere, "--database-url", pgNowhere}, emptyConfig},
		{[]string{"init", "--print", "--config", "", "--database-url", pgNowhere}, emptyConfig},
		{[]string{"publish", "--config=", "--nats-url", nowhere, "--events", "1"}, emptyConfig},
		{[]string{"dlq", "replay", "--config=", "--nats-url", nowhere, "--dry-run"}, emptyConfig},
		{[]string{"bench", "--config=", "--nats-url", nowhere, "--database-url", pgNowhere, "--events", "1"}, emptyConfig},
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

	// Given empty, --config does not fall back to JETSINK_CONFIG either.
	file := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(file, []byte("nats:\n  url: "+nowhere+"\npostgres:\n  url: "+pgNowhere+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JETSINK_CONFIG", file) // startJetsink clears it: the root is made after it is set
	root := newRoot()
	var out strings.Builder
	root.SetArgs([]string{"check", "--config="})
	root.SetOut(&out)
	root.SetErr(&out)
	err := execute(ctx, root)
	if code, msg := exitCode(err), out.String()+fmt.Sprint(err); code != exitConfig || !strings.Contains(msg, emptyConfig) {
		t.Errorf("JETSINK_CONFIG=FILE check --config=: exit %d, want %d with %q in:\n%s", code, exitConfig, emptyConfig, msg)
	}
}

// emptyConfig is what a command says of --config given empty.
const emptyConfig = "--config is empty (a variable left unset?)"

// A config path that is a directory (Docker's, for a file to mount that
// did not exist) is named with what gave it, --config or JETSINK_CONFIG,
// and the fix said: exit 2.
func TestConfigPathIsADirectory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	const fix = " is a directory (Docker makes one when the file to mount does not exist: create the file first)"
	r := startJetsink(t, ctx, "check", "--config", dir)
	if code, msg := r.wait(t, ctx), r.out.String()+fmt.Sprint(r.err); code != exitConfig || !strings.Contains(msg, "--config "+dir+fix) {
		t.Errorf("check --config DIR: exit %d, want %d saying %q in:\n%s", code, exitConfig, "--config "+dir+fix, msg)
	}
	// startJetsink clears JETSINK_CONFIG: the root is made after it is set.
	t.Setenv("JETSINK_CONFIG", dir)
	root := newRoot()
	var out strings.Builder
	root.SetArgs([]string{"check"})
	root.SetOut(&out)
	root.SetErr(&out)
	err := execute(ctx, root)
	if code, msg := exitCode(err), out.String()+fmt.Sprint(err); code != exitConfig || !strings.Contains(msg, "JETSINK_CONFIG="+dir+fix) {
		t.Errorf("JETSINK_CONFIG=DIR check: exit %d, want %d saying %q in:\n%s", code, exitConfig, "JETSINK_CONFIG="+dir+fix, msg)
	}
}
