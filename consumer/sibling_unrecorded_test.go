package consumer

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A jetsink from before jetsink_destination (2026-12-07) recorded its
// filter in the durable's metadata but not where it wrote. Upgraded, and
// nats.consumer renamed, the rename guard skipped that durable (its
// destination is not this one's: it has none) and the new durable stored
// the whole stream again, with no warning. A durable with a key of
// jetsink's and no destination is now found: New refuses in at-least-once
// mode naming it, says its destination is unknown, and tells how to have
// it recorded; check reports it alike. One with no key of jetsink's (made
// by another program) stays ignored.
func TestSiblingLookSeesAnUnrecordedJetsinkDurable(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	old := cfg.Consumer + "_old"
	foreign := cfg.Consumer + "_foreign"
	for name, meta := range map[string]map[string]string{old: {filterKey: ""}, foreign: nil} {
		if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 7, Metadata: meta}); err != nil { // floor 6
			t.Fatal(err)
		}
	}

	wants := []string{old + " (destination not recorded; ack floor at stream sequence 6",
		"that an older jetsink made or used without recording where it writes (no metadata key " + destinationKey + ")",
		"run a current jetsink on it once"}
	has := func(what, got string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(got, w) {
				t.Fatalf("%s lacks %q:\n%s", what, w, got)
			}
		}
		if strings.Contains(got, foreign) {
			t.Fatalf("%s names %s, which no jetsink made:\n%s", what, foreign, got)
		}
	}

	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New beside %s: %v, want ErrInvalidConfig", old, err)
	}
	has("New's error", err.Error())
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("durable %s after the refusal: %v, want none", cfg.Consumer, err)
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	p := siblingReported(ps, old)
	if p == nil || p.Warning || !p.Config {
		t.Fatalf("check reports %+v among %v; want an error naming %s", p, ps, old)
	}
	has("check's problem", p.String())

	// Recorded as another destination's (a current jetsink ran on it):
	// not this one's, and New makes the durable.
	editOnServer(t, ctx, js, Config{Stream: cfg.Stream, Consumer: old}, func(cc *jetstream.ConsumerConfig) {
		cc.Metadata[destinationKey] = "db1:5432/app public.other"
	})
	if _, log := newLoggedConsumer(t, ctx, cfg); strings.Contains(log.String(), old) {
		t.Fatalf("New beside %s, recorded as another destination's, names it:\n%s", old, log.String())
	}
}
