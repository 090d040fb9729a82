package tests

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// A poison row is dead-lettered; once the constraint is fixed, `jetsink dlq
// replay` sends it back to its subject and jetsink stores it: every event is
// a row, the dead-letter stream is empty, nothing is duplicated.
func TestDLQReplayAfterFix(t *testing.T) {
	const events = 3_000
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e.createStreams(ctx)
	r := e.start(ctx, e.faultConfig(sink.ExactlyOnce))
	e.exec(ctx, "ALTER TABLE "+e.tableID()+" ADD CONSTRAINT poison CHECK (seq % 1000 <> 123)")

	x := newExpected()
	e.publishDuring(ctx, x, 0, events, 0, 10).wait(t, ctx)
	e.waitSettled(ctx, x)
	if n := e.dlqCount(ctx); n != 3 {
		t.Fatalf("%d dead letters, want 3", n)
	}
	cfgPath := e.writeConfig(sink.ExactlyOnce)
	noCreate := []string{"JETSINK_CONFIG="}

	out, code := jetsinkCmd(t, noCreate, "dlq", "replay", "--config", cfgPath, "--dry-run", "--code", "constraint")
	if code != 0 || strings.Count(out, ": would replay\n") != 3 || !strings.Contains(out, "matched 3, would replay 3, would fail 0") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	out, code = jetsinkCmd(t, noCreate, "dlq", "replay", "--config", cfgPath, "--code", "invalid_json")
	if code != 0 || !strings.Contains(out, "matched 0") {
		t.Fatalf("replay of a code with no dead letters: exit %d\n%s", code, out)
	}

	e.exec(ctx, "ALTER TABLE "+e.tableID()+" DROP CONSTRAINT poison")
	out, code = jetsinkCmd(t, noCreate, "dlq", "replay", "--config", cfgPath, "--stage", "sink")
	if code != 0 || strings.Count(out, "replayed, deleted") != 3 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	t.Logf("replay output:\n%s", out)
	waitFor(t, ctx, "the replayed events stored", func() (bool, string) {
		n := e.rows(ctx)
		return n == events && e.dlqCount(ctx) == 0, "rows " + itoa(n)
	})
	r.drain(t)
	v := e.check(ctx, x)
	if v.dead != 0 || v.rows != events {
		t.Fatalf("after replay: %d rows, %d dead letters", v.rows, v.dead)
	}
	e.judge("dlq replay after fix", sink.ExactlyOnce, v, 0)
}

// An event whose dead letters fail until its deliveries run out (the
// dead-letter stream away: here, not made yet) is dead-lettered at last with
// the cause of the first failed letter, not as max_deliver: before, the
// stored letter said only "delivered 3 times without being stored", and
// `jetsink dlq replay --code invalid_json` did not find it.
func TestMaxDeliverLetterKeepsItsCause(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.CreateStream = false // which would make the dead-letter stream
	cfg.NATS.MaxDeliver = 1
	r := e.start(ctx, cfg)
	if _, err := e.js.Publish(ctx, e.prefix+".bad", []byte("nope")); err != nil {
		t.Fatal(err)
	}
	c := r.p.Consumer()
	// The first delivery's letter (invalid_json) and the second's, past
	// max_deliver, fail: no dead-letter stream.
	waitFor(t, ctx, "two failed dead letters", func() (bool, string) {
		st := c.Stats()
		return st.DeadLetterFailed >= 2, fmt.Sprintf("%+v", st)
	})
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.dlqStream(), Subjects: []string{cfg.NATS.DeadLetterSubject}}); err != nil {
		t.Fatal(err)
	}
	// Stored, and counted: the counts follow the PubAck, which may come
	// after the stream has the letter.
	waitFor(t, ctx, "the dead letter stored and counted", func() (bool, string) {
		n, st := e.dlqCount(ctx), c.Stats()
		return n == 1 && st.DeadLettered+st.MaxDelivered >= 1, "dead letters " + itoa(int64(n)) + fmt.Sprintf(", stats %+v", st)
	})
	dlq, err := e.js.Stream(ctx, e.dlqStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Header
	if h.Get(consumer.HeaderCode) != pipeline.CodeInvalidJSON || h.Get(consumer.HeaderStage) != pipeline.StageDecode ||
		!strings.HasPrefix(h.Get(consumer.HeaderReason), "delivered ") || !strings.Contains(h.Get(consumer.HeaderReason), " times, past nats.max_deliver") {
		t.Fatalf("dead letter headers %v, want code %s at stage %s, its deliveries in the reason", h, pipeline.CodeInvalidJSON, pipeline.StageDecode)
	}
	if st := c.Stats(); st.DeadLettered != 1 || st.MaxDelivered != 0 {
		t.Errorf("stats %+v: want the letter counted as dead-lettered, none as max_deliver", st)
	}
	// The metrics count the letter stored, not the one the worker sent
	// (once the dead-letterer has returned, after the term).
	const name = "jetsink_events_dead_lettered_total"
	var body string
	waitFor(t, ctx, "the letter in the metrics", func() (bool, string) {
		_, body = adminGet(t, ctx, r, "/metrics")
		return metricValue(body, name, `stage="decode"`, `code="invalid_json"`)+metricValue(body, name, `stage="deliver"`, `code="max_deliver"`) >= 1, grep(body, name)
	})
	if v, w := metricValue(body, name, `stage="decode"`, `code="invalid_json"`), metricValue(body, name, `stage="deliver"`, `code="max_deliver"`); v != 1 || w != 0 {
		t.Errorf("%s: %v for decode/invalid_json (want 1), %v for deliver/max_deliver (want 0)\n%s", name, v, w, grep(body, name))
	}
	r.drain(t)
}

// A dead-letter stream a round trip of 200 ms away stores one subject's
// letters one at a time, 200 ms or more each: the last of 60 poison events
// waits for its letter 12 s or more, three times ack_wait. The events
// waiting in the worker's lane get InProgress, so JetStream delivers none
// of them again (before, it delivered the ones past ack_wait again, and
// again, each a letter stored in vain: the dead-letter stream that was
// slow got more to do) and each is dead-lettered once.
//
// ack_wait is 4 s: InProgress comes up to 5/12 of ack_wait apart and takes
// 100 ms through the proxy, which with 2 s left ~1.1 s for a stall of the
// race-instrumented process on a loaded machine, and with 4 s leaves ~2.2
// s. The letters are as many as keep the wait at three times ack_wait:
// without InProgress, every event past the first ~20 comes again.
func TestSlowDeadLetterStreamRedeliversNothing(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e.createStreams(ctx)
	const n = 60
	for i := range n {
		if _, err := e.js.Publish(ctx, e.prefix+".bad", []byte("nope "+itoa(int64(i)))); err != nil {
			t.Fatal(err)
		}
	}
	far := testenv.NewDelayProxy(t, strings.TrimPrefix(e.natsURL, "nats://"), 100*time.Millisecond)
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.URL = far.URL()
	cfg.NATS.AckWait = 4 * time.Second
	r := e.start(ctx, cfg)
	c := r.p.Consumer()
	waitFor(t, ctx, "every poison event dead-lettered", func() (bool, string) {
		st := c.Stats()
		return e.dlqCount(ctx) == n && st.DeadLettered >= n, fmt.Sprintf("dead letters %d, stats %+v", e.dlqCount(ctx), st)
	})
	st := c.Stats()
	if st.Redelivered != 0 || st.DeadLettered != n {
		t.Errorf("stats %+v: want no event delivered again and %d dead-lettered once each", st, n)
	}
	if ps := r.p.PipelineStats(); ps.LetterInProgress == 0 {
		t.Errorf("pipeline stats %+v: no InProgress sent for the waiting letters", ps)
	}
	r.drain(t)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestDLQHelp(t *testing.T) {
	for _, args := range [][]string{{"dlq", "--help"}, {"dlq", "replay", "--help"}} {
		out, code := jetsinkCmd(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("jetsink %v: exit %d\n%s", args, code, out)
		}
	}
	out, code := jetsinkCmd(t, nil, "dlq", "replay", "--seq", "9-3")
	if code != 2 || !strings.Contains(out, "--seq") {
		t.Errorf("a reversed --seq: exit %d, want 2\n%s", code, out)
	}
}
