package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/sink"
)

// The checker: after the faults heal and the stream drains, every event
// published is either a row or a dead letter (nothing lost), every row and
// dead letter is an event published (nothing unexpected), and duplicates stay
// within what the delivery mode allows.
//
// Identity: a loadgen event is its seq (rows: the seq column, whose id must
// be loadgen's id for that seq; dead letters: the seq and id of the original
// body). Any other message a scenario publishes is its Nats-Msg-Id, which a
// dead letter carries in Jetsink-Msg-Id.

// expected is what a scenario published.
type expected struct {
	seqs  map[uint64]bool // loadgen seqs
	other map[string]bool // Nats-Msg-Ids of messages that are not loadgen events
}

func newExpected() *expected {
	return &expected{seqs: map[uint64]bool{}, other: map[string]bool{}}
}

func (x *expected) addRange(first uint64, n int) {
	for i := range n {
		x.seqs[first+uint64(i)] = true
	}
}

func (x *expected) total() int { return len(x.seqs) + len(x.other) }

// deadLetter is one message of the dead-letter stream.
type deadLetter struct {
	seq    uint64 // in the DLQ stream
	header nats.Header
	data   []byte
}

func (d deadLetter) get(h string) string { return d.header.Get(h) }

// verdict is the checker's result.
type verdict struct {
	published   int
	rows        int64 // rows in the table
	dead        int   // dead letters
	duplicates  int64 // rows and dead letters beyond one per event
	lost        []string
	unexpected  []string
	deadLetters []deadLetter
	// By event (keyed "seq:<seq>" for a loadgen event, "msg:<Nats-Msg-Id>"
	// for another message): its rows, and its dead letters. A scenario
	// whose events are either good or bad by design checks each against
	// its kind (e.g. chaosCheckEach): check alone counts a row and a dead
	// letter alike as delivered.
	rowsOf    map[string]int
	lettersOf map[string][]deadLetter
}

// dlqStream is the stream createStreams makes for the dead-letter subject.
func (e *env) dlqStream() string { return e.stream + "_DLQ" }

// readDeadLetters reads the whole dead-letter stream with an ordered consumer.
func (e *env) readDeadLetters(ctx context.Context) []deadLetter {
	e.t.Helper()
	s, err := e.js.Stream(ctx, e.dlqStream())
	if err != nil {
		e.t.Fatalf("dead-letter stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		e.t.Fatalf("dead-letter stream info: %v", err)
	}
	want := info.State.Msgs
	out := make([]deadLetter, 0, want)
	if want == 0 {
		return out
	}
	oc, err := e.js.OrderedConsumer(ctx, e.dlqStream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatalf("ordered consumer on %s: %v", e.dlqStream(), err)
	}
	for uint64(len(out)) < want {
		batch, err := oc.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			e.t.Fatalf("fetch dead letters: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				e.t.Fatalf("dead letter metadata: %v", err)
			}
			out = append(out, deadLetter{seq: meta.Sequence.Stream, header: m.Headers(), data: m.Data()})
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			e.t.Fatalf("fetch dead letters: %v", err)
		}
		if n == 0 && ctx.Err() != nil {
			e.t.Fatalf("read %d of %d dead letters: %v", len(out), want, ctx.Err())
		}
	}
	return out
}

// dlqCount is the number of messages in the dead-letter stream, 0 if it
// cannot be read right now.
func (e *env) dlqCount(ctx context.Context) uint64 {
	s, err := e.js.Stream(ctx, e.dlqStream())
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// waitSettled waits until every published event is a row or a dead letter
// and the consumer has nothing pending or unacked.
func (e *env) waitSettled(ctx context.Context, x *expected) {
	e.t.Helper()
	want := int64(x.total())
	waitFor(e.t, ctx, fmt.Sprintf("%d events stored or dead-lettered and an empty consumer", want), func() (bool, string) {
		var seqs int64
		if err := e.db.QueryRow(ctx, "SELECT count(DISTINCT seq) FROM "+pgx.Identifier{e.table}.Sanitize()).Scan(&seqs); err != nil {
			return false, "count rows: " + err.Error()
		}
		dl := int64(e.dlqCount(ctx))
		c, err := e.js.Consumer(ctx, e.stream, "jetsink")
		if err != nil {
			return false, "consumer: " + err.Error()
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, "consumer info: " + err.Error()
		}
		state := fmt.Sprintf("distinct seqs %d + dead letters %d of %d; pending %d, ack pending %d, redelivered %d",
			seqs, dl, want, info.NumPending, info.NumAckPending, info.NumRedelivered)
		return seqs+dl >= want && info.NumPending == 0 && info.NumAckPending == 0, state
	})
}

// check compares the table and the dead-letter stream with x. It fails the
// test on a lost or unexpected event; duplicates are returned for the caller
// to judge against its mode (see judge).
func (e *env) check(ctx context.Context, x *expected) verdict {
	e.t.Helper()
	v := verdict{published: x.total(), rowsOf: map[string]int{}, lettersOf: map[string][]deadLetter{}}
	found := map[string]int{}
	rows, err := e.db.Query(ctx, "SELECT seq, id::text FROM "+pgx.Identifier{e.table}.Sanitize())
	if err != nil {
		e.t.Fatalf("read rows: %v", err)
	}
	for rows.Next() {
		var seq int64
		var id string
		if err := rows.Scan(&seq, &id); err != nil {
			e.t.Fatalf("read rows: %v", err)
		}
		v.rows++
		want := loadgen.Make(e.run, uint64(seq), 1)
		if seq < 0 || !x.seqs[uint64(seq)] || want.UUID() != id {
			v.unexpected = append(v.unexpected, fmt.Sprintf("row seq %d id %s", seq, id))
			continue
		}
		found["seq:"+strconv.FormatInt(seq, 10)]++
		v.rowsOf["seq:"+strconv.FormatInt(seq, 10)]++
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("read rows: %v", err)
	}
	v.deadLetters = e.readDeadLetters(ctx)
	v.dead = len(v.deadLetters)
	for _, d := range v.deadLetters {
		key, ok := e.deadLetterKey(d, x)
		if !ok {
			v.unexpected = append(v.unexpected, fmt.Sprintf("dead letter %d (%s, stream seq %s, msg id %q)",
				d.seq, d.get(consumer.HeaderCode), d.get(consumer.HeaderStreamSeq), d.get(consumer.HeaderOrigMsgID)))
			continue
		}
		found[key]++
		v.lettersOf[key] = append(v.lettersOf[key], d)
	}
	for s := range x.seqs {
		if found["seq:"+strconv.FormatUint(s, 10)] == 0 {
			v.lost = append(v.lost, "seq "+strconv.FormatUint(s, 10))
		}
	}
	for id := range x.other {
		if found["msg:"+id] == 0 {
			v.lost = append(v.lost, "msg "+id)
		}
	}
	for _, n := range found {
		if n > 1 {
			v.duplicates += int64(n - 1)
		}
	}
	sort.Strings(v.lost)
	if len(v.lost) > 0 {
		e.t.Errorf("%d events lost (neither a row nor a dead letter), first: %s", len(v.lost), strings.Join(first(v.lost, 10), ", "))
	}
	if len(v.unexpected) > 0 {
		e.t.Errorf("%d unexpected rows or dead letters, first: %s", len(v.unexpected), strings.Join(first(v.unexpected, 10), ", "))
	}
	return v
}

// deadLetterKey identifies the event a dead letter parks.
func (e *env) deadLetterKey(d deadLetter, x *expected) (string, bool) {
	if d.get(consumer.HeaderStream) != e.stream || d.get(consumer.HeaderStreamSeq) == "" {
		return "", false
	}
	var body struct {
		ID  string  `json:"id"`
		Seq *uint64 `json:"seq"`
	}
	if json.Unmarshal(d.data, &body) == nil && body.Seq != nil && x.seqs[*body.Seq] {
		want := loadgen.Make(e.run, *body.Seq, 1)
		if want.UUID() == body.ID {
			return "seq:" + strconv.FormatUint(*body.Seq, 10), true
		}
	}
	if id := d.get(consumer.HeaderOrigMsgID); x.other[id] {
		return "msg:" + id, true
	}
	return "", false
}

// judge fails the test when duplicates exceed what mode allows: none in
// exactly-once mode; at most allowed (the processor's own count of
// uncertain commits and redeliveries, the batches in flight at a kill -9,
// or a bound on either: outageAllowance) in at-least-once mode. It logs
// the scenario's one-line summary.
func (e *env) judge(name string, mode sink.Mode, v verdict, allowed int64) {
	e.t.Helper()
	e.t.Logf("SUMMARY %-28s %-13s published=%d rows=%d dead_letters=%d duplicates=%d allowed_duplicates=%d lost=%d unexpected=%d",
		name, mode, v.published, v.rows, v.dead, v.duplicates, allowed, len(v.lost), len(v.unexpected))
	switch {
	case mode == sink.ExactlyOnce && v.duplicates != 0:
		e.t.Errorf("exactly-once: %d duplicates, want 0", v.duplicates)
	case v.duplicates > allowed:
		e.t.Errorf("at-least-once: %d duplicates, more than the %d allowed", v.duplicates, allowed)
	}
}

// judgeValid is judge for a run whose events are all valid: none may be
// dead-lettered either (a fault misread as a bad row, a valid event taken
// past max_deliver), which judge alone would count as delivered.
func (e *env) judgeValid(name string, mode sink.Mode, v verdict, allowed int64) {
	e.t.Helper()
	if v.dead != 0 {
		e.t.Errorf("%d valid events dead-lettered, want none", v.dead)
	}
	e.judge(name, mode, v, allowed)
}

// sinkAllowance is what the sink itself counts as possible duplicates: rows
// whose COMMIT outcome was unknown and rows whose ack failed after commit.
func sinkAllowance(st sink.Stats) int64 {
	return int64(st.PossibleDuplicates + st.AckErrors)
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// publisher publishes events in the background while a fault happens. Its
// error comes back on done; it never fails the test itself.
type publisher struct {
	done chan error
	res  loadgen.Result
}

// finish waits for every publish of pub and for every event of x to be
// settled, drains r, and checks the table against x.
func (e *env) finish(t *testing.T, ctx context.Context, pub *publisher, x *expected, r *running) verdict {
	t.Helper()
	pub.wait(t, ctx)
	e.waitSettled(ctx, x)
	r.drain(t)
	return e.check(ctx, x)
}

// publishDuring starts publishing n loadgen events from first at rate
// events/s (0: as fast as acknowledged) and adds them to x.
func (e *env) publishDuring(ctx context.Context, x *expected, first uint64, n int, rate float64, subjects int) *publisher {
	x.addRange(first, n)
	p := &publisher{done: make(chan error, 1)}
	o := loadgen.Options{Subject: e.prefix, Subjects: subjects, Run: e.run, First: first, MaxPending: 512}
	if rate > 0 {
		o.Rate = rate
		// Rounded up so that Rate x Duration is n, not n-1.
		o.Duration = time.Duration(math.Ceil(float64(n) / rate * float64(time.Second)))
	} else {
		o.Events = n
	}
	go func() {
		res, err := loadgen.Publish(ctx, e.nc, o)
		p.res = res
		if err == nil && res.Sent != n {
			err = fmt.Errorf("sent %d of %d", res.Sent, n)
		}
		p.done <- err
	}()
	return p
}

// wait waits for the publisher and fails the test if it failed.
func (p *publisher) wait(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("publisher: %v (%+v)", err, p.res)
		}
	case <-ctx.Done():
		t.Fatalf("publisher did not finish: %v", ctx.Err())
	}
}
