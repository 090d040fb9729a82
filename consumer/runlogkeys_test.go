package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// jsonLog is a consumer's log as JSON lines (what --log-format json
// writes), in a buffer safe for the logger's concurrent writers.
func jsonLog(t testing.TB) (*slog.Logger, *syncBuffer) {
	t.Helper()
	buf := &syncBuffer{}
	return slog.New(slog.NewJSONHandler(io.MultiWriter(buf, tWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// newJSONLogged is New(ctx, cfg) logging JSON into the returned buffer
// (jsonLog), closed when t ends.
func newJSONLogged(t testing.TB, ctx context.Context, cfg Config) (*Consumer, *syncBuffer) {
	t.Helper()
	log, buf := jsonLog(t)
	c, err := New(ctx, cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, buf
}

// jsonRecords parses each line of text as one JSON object, failing t for
// a line that is none or that has a key twice (Elasticsearch and
// OpenSearch refuse such a document; encoding/json keeps the last).
func jsonRecords(t testing.TB, text string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(text) {
		if dup, err := duplicateKey(line); err != nil || dup != "" {
			t.Fatalf("log line with key %q twice (err %v):\n%s", dup, err, line)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is no JSON object: %v\n%s", err, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// duplicateKey returns the first key line's top-level object has twice.
func duplicateKey(line string) (string, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(line)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", fmt.Errorf("no object: %v %v", tok, err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		k := tok.(string)
		if seen[k] {
			return k, nil
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "", err
		}
	}
	return "", nil
}

// records returns the records of recs whose msg starts with msg.
func records(recs []map[string]any, msg string) []map[string]any {
	var found []map[string]any
	for _, r := range recs {
		if m, _ := r["msg"].(string); strings.HasPrefix(m, msg) {
			found = append(found, r)
		}
	}
	return found
}

// The consumer's logger carries stream and consumer; the lines of a look
// at the durable (a pause on the server and its end, a filter edited,
// another jetsink's filter kept and then set back) added consumer again:
// one JSON object with the key twice, which Elasticsearch refuses.
func TestLookLinesNameTheConsumerOnce(t *testing.T) {
	onePassOnly(t) // no pull
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c, buf := newJSONLogged(t, ctx, cfg)
	look := func() string {
		t.Helper()
		return c.refreshFloor(ctx)
	}

	if _, err := js.PauseConsumer(ctx, cfg.Stream, cfg.Consumer, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	look()
	if _, err := js.ResumeConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	look()
	only := subjectOf(cfg, 0, 2)
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.FilterSubject = only })
	look()
	// Another jetsink's filter, as it records it: kept, then, seen an
	// hour ago, set back.
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) {
		cc.Metadata[filterKey], cc.Metadata[filterSetAtKey] = only, filterSetAt(time.Now(), only)
	})
	look()
	c.filterSeenMu.Lock()
	c.filterSeen = &seenFilter{filter: only, at: time.Now().Add(-time.Hour)}
	c.filterSeenMu.Unlock()
	look()

	recs := jsonRecords(t, buf.String())
	for _, msg := range []string{
		"the consumer was paused on the server",
		"the consumer's pause on the server is over",
		"the consumer's filter was changed on the server",
		"another jetsink of this durable consumer consumes with another filter",
		"another jetsink of this durable consumer set another filter",
	} {
		found := records(recs, msg)
		if len(found) != 1 || found[0]["consumer"] != cfg.Consumer || found[0]["stream"] != cfg.Stream {
			t.Fatalf("%d lines %q (want 1, with consumer %s and stream %s):\n%v", len(found), msg, cfg.Consumer, cfg.Stream, found)
		}
	}
}
