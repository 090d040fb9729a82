package processor

import (
	"testing"
	"time"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/sink"
)

// An instance cut off from PostgreSQL gives its events back after
// ack_wait, or 30 s if ack_wait is shorter: a failover or a pooler's
// restart never moves them.
func TestReleaseAfter(t *testing.T) {
	for _, c := range []struct{ ackWait, want time.Duration }{
		{time.Second, 30 * time.Second},
		{10 * time.Second, 30 * time.Second},
		{30 * time.Second, 30 * time.Second},
		{45 * time.Second, 45 * time.Second},
		{5 * time.Minute, 5 * time.Minute},
	} {
		if got := releaseAfter(c.ackWait); got != c.want {
			t.Errorf("ack_wait %v: release after %v, want %v", c.ackWait, got, c.want)
		}
	}
}

// The sink gets nats.max_deliver, -1 (no limit) as its 0, so that it
// keeps an event on its last delivery rather than give it back.
func TestSetRelease(t *testing.T) {
	for _, c := range []struct {
		ackWait    time.Duration
		maxDeliver int
		want       sink.Config
	}{
		{10 * time.Second, 10, sink.Config{ReleaseAfter: 30 * time.Second, MaxDeliver: 10}},
		{2 * time.Minute, -1, sink.Config{ReleaseAfter: 2 * time.Minute, MaxDeliver: 0}},
		{time.Second, 1, sink.Config{ReleaseAfter: 30 * time.Second, MaxDeliver: 1}},
	} {
		var got sink.Config
		setRelease(&got, &consumer.Config{AckWait: c.ackWait, MaxDeliver: c.maxDeliver})
		if got.ReleaseAfter != c.want.ReleaseAfter || got.MaxDeliver != c.want.MaxDeliver {
			t.Errorf("ack_wait %v, max_deliver %d: ReleaseAfter %v, MaxDeliver %d; want %v, %d",
				c.ackWait, c.maxDeliver, got.ReleaseAfter, got.MaxDeliver, c.want.ReleaseAfter, c.want.MaxDeliver)
		}
	}
}
