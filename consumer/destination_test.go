package consumer

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// destinationWarnings counts the Warn lines in log that name both
// destinations of a split (each holds a space: slog quotes them).
func destinationWarnings(log *syncBuffer, ours, other string) int {
	n := 0
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "split its events") &&
			strings.Contains(l, " destination="+strconv.Quote(ours)) && strings.Contains(l, "recorded_destination="+strconv.Quote(other)) {
			n++
		}
	}
	return n
}

// Two jetsinks of one durable writing to two destinations split the
// stream's events between them, silently before: each records its
// destination in the durable's metadata, the one that starts warns of
// the other's record, and each look at the consumer (refreshFloor) warns
// of the other's and records its own again, so that both keep warning
// while both run; once one has gone, the other's looks find its own
// record and say nothing. A third of the same destination warns of
// nothing. An operator's metadata key stays.
func TestDestinationsSharingADurableWarn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	const a, b = "db1:5432/app public.events_a", "db1:5432/app public.events_b"
	cfgA := testConfig(t, srv)
	cfgA.Destination = a
	cA, logA := newLoggedConsumer(t, ctx, cfgA)
	recorded := func() string { t.Helper(); return onServerConfig(t, ctx, js, cfgA).Metadata[destinationKey] }
	if got := recorded(); got != a {
		t.Fatalf("recorded destination %q after the first start, want %q", got, a)
	}
	if strings.Contains(logA.String(), "split its events") {
		t.Fatalf("the first start warns of a split; log:\n%s", logA.String())
	}
	editOnServer(t, ctx, js, cfgA, func(cc *jetstream.ConsumerConfig) { cc.Metadata["owner"] = "ops" })

	cfgB := cfgA
	cfgB.Destination = b
	cB, logB := newLoggedConsumer(t, ctx, cfgB)
	if n := destinationWarnings(logB, b, a); n != 1 {
		t.Fatalf("%d Warn lines naming both destinations at B's start, want 1; log:\n%s", n, logB.String())
	}
	if !strings.Contains(logB.String(), "own nats.consumer") {
		t.Fatalf("B's Warn gives no fix; log:\n%s", logB.String())
	}
	if got := recorded(); got != b {
		t.Fatalf("recorded destination %q after B's start, want %q", got, b)
	}

	// Both run: each look warns and records its own.
	for i := 1; i <= 2; i++ {
		if why := cA.refreshFloor(ctx); why != "" {
			t.Fatalf("A's look %d found %q changed, want nothing", i, why)
		}
		if n := destinationWarnings(logA, a, b); n != i {
			t.Fatalf("%d Warn lines from A after its look %d, want %d; log:\n%s", n, i, i, logA.String())
		}
		if got := recorded(); got != a {
			t.Fatalf("recorded destination %q after A's look, want %q", got, a)
		}
		if why := cB.refreshFloor(ctx); why != "" {
			t.Fatalf("B's look %d found %q changed, want nothing", i, why)
		}
		if n := destinationWarnings(logB, b, a); n != i+1 {
			t.Fatalf("%d Warn lines from B after its look %d, want %d; log:\n%s", n, i, i+1, logB.String())
		}
		if got := recorded(); got != b {
			t.Fatalf("recorded destination %q after B's look, want %q", got, b)
		}
	}
	// A gone: B's looks find its own record.
	if err := cA.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cB.refreshFloor(ctx)
	cB.refreshFloor(ctx)
	if n := destinationWarnings(logB, b, a); n != 3 {
		t.Fatalf("%d Warn lines from B once A had gone, want still 3; log:\n%s", n, logB.String())
	}

	// The same destination: no warning, at the start or at a look.
	cB2, logB2 := newLoggedConsumer(t, ctx, cfgB)
	cB2.refreshFloor(ctx)
	cB.refreshFloor(ctx)
	if strings.Contains(logB2.String(), "split its events") || strings.Count(logB.String(), "split its events") != 3 {
		t.Fatalf("a jetsink of the same destination brought a warning; logs:\n%s\n%s", logB2.String(), logB.String())
	}
	if cc := onServerConfig(t, ctx, js, cfgA); cc.Metadata["owner"] != "ops" || cc.Metadata[destinationKey] != b {
		t.Fatalf("metadata %v, want the operator's owner=ops kept and %s=%q", cc.Metadata, destinationKey, b)
	}

	// A removed record is recorded again by the next look, silently.
	editOnServer(t, ctx, js, cfgA, func(cc *jetstream.ConsumerConfig) { delete(cc.Metadata, destinationKey) })
	cB.refreshFloor(ctx)
	if got := recorded(); got != b || strings.Count(logB.String(), "split its events") != 3 {
		t.Fatalf("recorded destination %q after a look at a removed record, want %q with no warning; log:\n%s", got, b, logB.String())
	}
}

// The destination record survives the other rewrites of the durable's
// metadata (markReplaced's, through updateMeta; ensureConsumer's while
// another jetsink's filter is kept), and the look that records it again
// changes nothing else: not another jetsink's filter or its record, not
// that one's longer ack_wait (which consumerConfig would set back to
// this one's, and the other's next look would find shortened and end
// its session for: the two would do so every floorEvery).
func TestDestinationRecordKeepsTheFilterRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	const a, b = "db1:5432/app events", "db2:5432/app events"
	cfgA := testConfig(t, srv)
	cfgA.Destination = a
	cA, logA := newLoggedConsumer(t, ctx, cfgA)
	onServer := func() jetstream.ConsumerConfig { t.Helper(); return onServerConfig(t, ctx, js, cfgA) }

	only := subjectOf(cfgA, 0, 2)
	cfgB := cfgA
	cfgB.Destination, cfgB.FilterSubject, cfgB.AckWait = b, only, 2*cfgA.AckWait
	cB, _ := newLoggedConsumer(t, ctx, cfgB)
	atB := onServer()
	if atB.FilterSubject != only || atB.Metadata[filterKey] != only || atB.AckWait != cfgB.AckWait || atB.Metadata[destinationKey] != b {
		t.Fatalf("after B's start: filter %q, ack_wait %v, metadata %v", atB.FilterSubject, atB.AckWait, atB.Metadata)
	}
	// A's look keeps B's filter (another jetsink's, in its keep) and
	// records A, nothing more.
	if why := cA.refreshFloor(ctx); why != "" {
		t.Fatalf("A's look found %q changed, want nothing", why)
	}
	cc := onServer()
	if cc.Metadata[destinationKey] != a || cc.FilterSubject != only || cc.AckWait != cfgB.AckWait ||
		cc.Metadata[filterKey] != only || cc.Metadata[filterSetAtKey] != atB.Metadata[filterSetAtKey] {
		t.Fatalf("after A's look: filter %q, ack_wait %v, metadata %v; want A recorded and B's filter, record and ack_wait %v kept",
			cc.FilterSubject, cc.AckWait, cc.Metadata, cfgB.AckWait)
	}
	if why := cB.refreshFloor(ctx); why != "" {
		t.Fatalf("B's look after A's record found %q changed, want nothing", why)
	}
	if got := onServer().Metadata[destinationKey]; got != b {
		t.Fatalf("recorded destination %q after B's look, want %q", got, b)
	}

	// A metadata rewrite of A's keeps B's record.
	created := time.Now()
	if err := cA.markReplaced(ctx, created, true); err != nil {
		t.Fatal(err)
	}
	if cc := onServer(); cc.Metadata[destinationKey] != b || cc.Metadata[replacedKey] != replacedMark(created) || cc.FilterSubject != only {
		t.Fatalf("after markReplaced: filter %q, metadata %v; want %s=%q kept", cc.FilterSubject, cc.Metadata, destinationKey, b)
	}
	// A applying its configuration again (Run, after a change it sets
	// back) keeps B's filter, warns of B's destination and records A's.
	before := strings.Count(logA.String(), "split its events")
	if err := cA.ensureConsumer(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if cc := onServer(); cc.Metadata[destinationKey] != a || cc.FilterSubject != only || cc.Metadata[filterKey] != only || cc.Metadata[replacedKey] == "" {
		t.Fatalf("after A's ensureConsumer: filter %q, metadata %v; want A recorded, B's filter and the replaced mark kept",
			cc.FilterSubject, cc.Metadata)
	}
	if n := strings.Count(logA.String(), "split its events"); n != before+1 {
		t.Fatalf("%d Warn lines of a split after A's ensureConsumer, want %d; log:\n%s", n, before+1, logA.String())
	}
}

// A jetsink without a destination (Config.Destination "") records and
// compares nothing: a record there stays, and nothing is said.
func TestNoDestinationRecordsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	if _, ok := onServerConfig(t, ctx, js, cfg).Metadata[destinationKey]; ok {
		t.Fatalf("a destination recorded with none configured: %v", onServerConfig(t, ctx, js, cfg).Metadata)
	}
	editOnServer(t, ctx, js, cfg, func(cc *jetstream.ConsumerConfig) { cc.Metadata[destinationKey] = "elsewhere" })
	c.refreshFloor(ctx)
	if got := onServerConfig(t, ctx, js, cfg).Metadata[destinationKey]; got != "elsewhere" || strings.Contains(log.String(), "split its events") {
		t.Fatalf("record %q after a look, want elsewhere kept, no warning; log:\n%s", got, log.String())
	}
	if got := checkText(t, ctx, cfg, false); strings.Contains(got, "split its events") {
		t.Fatalf("check without a destination reports one:\n%s", got)
	}
}

// check reports a durable whose record names another destination than
// the configured one, as a warning (a move to a new destination shows it
// until run records the new one), with the fix; not the same one.
func TestCheckReportsAnotherDestination(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	cfg.Destination = "db1:5432/app events_a"
	newConsumer(t, ctx, cfg)
	if got := checkText(t, ctx, cfg, false); strings.Contains(got, "split its events") {
		t.Fatalf("check of the recorded destination reports a split:\n%s", got)
	}
	other := cfg
	other.Destination = "db1:5432/app events_b"
	ps, err := Check(ctx, other, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	var found *Problem
	for i, p := range ps {
		if strings.Contains(p.Message, "split its events") {
			found = &ps[i]
		}
	}
	if found == nil {
		t.Fatalf("check of another destination does not report the split: %v", ps)
	}
	if !found.Warning || found.Config ||
		!strings.Contains(found.Message, `"db1:5432/app events_a"`) || !strings.Contains(found.Message, `"db1:5432/app events_b"`) ||
		!strings.Contains(found.Fix, "own nats.consumer") {
		t.Fatalf("check reports %+v; want a warning naming both destinations, with the fix", *found)
	}
}
