package processor

import (
	"math"
	"testing"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
)

// The sink may take in, while the database stalls, every row in flight:
// no limit while the wire client's byte budget bounds what is in flight,
// whatever max_ack_pending (the stream deleting rows the sink holds lets
// JetStream deliver past it, and rows left in the rings would get no
// InProgress and come again after ack_wait, each copy stored); without a
// byte budget, every row the stages before it can hold (rings rounded up
// as ringq rounds them), or max_ack_pending, if more.
func TestHoldRowsCoverWhatIsInFlight(t *testing.T) {
	cfg := config.Default()
	cfg.Pipeline.RingSize = 1000 // 1,024 slots
	cfg.NATS.PullMaxMessages = 500
	for _, maxAckPending := range []int{0, 3000, 50_000, -1} {
		cfg.NATS.MaxAckPending = maxAckPending
		if got := holdRows(&cfg, 2); got != math.MaxInt {
			t.Errorf("max_ack_pending %d under a byte budget: HoldRows %d, want no limit", maxAckPending, got)
		}
	}
	// No byte budget: memory comes first.
	for _, c := range []struct {
		maxAckPending, want int
	}{
		{-1, 2*2*1024 + 500},
		{3000, 2*2*1024 + 500},
		{50_000, 50_000},
	} {
		for _, set := range []func(*config.Config){
			func(c *config.Config) { c.NATS.PullClient = consumer.PullClientNATSGo },
			func(c *config.Config) { c.NATS.MaxInFlightBytes = -1 },
		} {
			cc := cfg
			cc.NATS.MaxAckPending = c.maxAckPending
			set(&cc)
			if got := holdRows(&cc, 2); got != c.want {
				t.Errorf("pull client %q, max_in_flight_bytes %d, max_ack_pending %d: HoldRows %d, want %d",
					cc.NATS.PullClient, cc.NATS.MaxInFlightBytes, cc.NATS.MaxAckPending, got, c.want)
			}
		}
	}
}

// "No limit" holds only while the wire client pulls under its byte
// budget: while nats.go pulls (a websocket URL, wire given up) the limit
// is what the rings and the pull buffer hold.
func TestHoldLimitFollowsTheByteBudget(t *testing.T) {
	var limit int64
	f := holdLimit(func() (int64, int64) { return 0, limit }, 4596)
	for _, c := range []struct {
		limit int64
		want  int
	}{{0, 4596}, {32 << 20, math.MaxInt}, {0, 4596}} {
		limit = c.limit
		if got := f(); got != c.want {
			t.Errorf("byte budget %d: hold limit %d, want %d", c.limit, got, c.want)
		}
	}
}

// The events waiting for their dead letters are bounded as the sink's rows
// are: no limit of their own while a byte budget bounds the pulls, else as
// many as JetStream lets the consumer have unacked, and the pipeline's
// default with no limit there either.
func TestLetterLimitFollowsTheBudgets(t *testing.T) {
	var limit int64
	budget := func() (int64, int64) { return 0, limit }
	cfg := config.Default()
	for _, c := range []struct {
		maxAckPending int
		limit         int64
		want          int
	}{
		{10_000, 32 << 20, math.MaxInt},
		{10_000, 0, 10_000},
		{100, 0, pipeline.DefaultLetterLimit},
		{-1, 0, pipeline.DefaultLetterLimit},
		{-1, 32 << 20, math.MaxInt},
	} {
		cfg.NATS.MaxAckPending, limit = c.maxAckPending, c.limit
		if got := letterLimit(&cfg, budget)(); got != c.want {
			t.Errorf("max_ack_pending %d, byte budget %d: letter limit %d, want %d", c.maxAckPending, c.limit, got, c.want)
		}
	}
}
