package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/sink"
)

// The table locked past ack_wait, on a stream whose max_age deletes events
// jetsink holds: JetStream drops them from its count of unacked messages
// and delivers more than max_ack_pending. The sink's hold, limited to
// max_ack_pending rows, filled; the rows after it waited in the rings with
// no InProgress, came again every ack_wait, and each copy was stored once
// the lock went (a review: 6,120 extra rows after a 90 s hold at 200
// events/s). Under the wire client's byte budget the sink holds every row
// in flight now: each event is stored once.
func TestStallOnAnAgingStreamStoresEachEventOnce(t *testing.T) {
	const (
		maxAge  = 5 * time.Second
		ackWait = 1500 * time.Millisecond
		lock    = 12 * time.Second // events published meanwhile: 400/s
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newEnv(t)
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".>"}, MaxAge: maxAge}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: e.stream + "_DLQ", Subjects: []string{"dlq." + e.stream}}); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.CreateStream = false
	cfg.NATS.PullClient = consumer.PullClientWire
	cfg.NATS.AckWait = ackWait
	cfg.NATS.MaxAckPending = 1000 // a hold of 1,000 rows filled within 3 s of the lock
	cfg.Pipeline.RingSize = 128
	r := e.start(ctx, cfg)
	e.publish(ctx, 1, 1, 1)
	e.waitDrained(ctx, 1, r) // the table is made

	tx := e.lockTable(ctx, e.pg.Conn(t), "ACCESS EXCLUSIVE")
	res, err := loadgen.Publish(ctx, e.nc, loadgen.Options{Subject: e.prefix, Subjects: 4, Rate: 400, Duration: lock, Run: e.run, First: 2})
	if err != nil {
		t.Fatalf("publish: %+v: %v", res, err)
	}
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if first := s.CachedInfo().State.FirstSeq; first < 1000 {
		t.Fatalf("the stream's first sequence is %d as the lock ends: max_age deleted too few held events for the test to show anything", first)
	}
	if err := tx.Rollback(ctx); err != nil { // releases the lock
		t.Fatal(err)
	}
	waitFor(t, ctx, "the consumer settled", func() (bool, string) {
		info := e.consumerInfo(ctx)
		return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("pending %d, ack pending %d", info.NumPending, info.NumAckPending)
	})
	rows := e.count(ctx, "SELECT count(*) FROM "+e.tableID())
	seqs := e.count(ctx, "SELECT count(DISTINCT stream_seq) FROM "+e.tableID())
	if rows != seqs {
		t.Errorf("%d rows for %d events: %d stored more than once", rows, seqs, rows-seqs)
	}
	t.Logf("%d events published during the lock, %d stored (those the stream deleted before jetsink read them are not)", res.Acked, seqs-1)
	r.drain(t)
}
