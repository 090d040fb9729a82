package processor

import (
	"math"
	"testing"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
)

// The sink may take in, while the database stalls, every row the stages
// before it can hold (rings rounded up as ringq rounds them), or as many
// as JetStream lets the consumer have unacked; with max_ack_pending -1 (no
// limit) that is no limit, or rows left in the rings would get no
// InProgress and come again after ack_wait.
func TestHoldRowsCoverWhatIsInFlight(t *testing.T) {
	cfg := config.Default()
	cfg.Pipeline.RingSize = 1000 // 1,024 slots
	cfg.NATS.PullMaxMessages = 500
	for _, c := range []struct {
		maxAckPending, want int
	}{
		{0, 2*2*1024 + 500},
		{3000, 2*2*1024 + 500},
		{50_000, 50_000},
		{-1, math.MaxInt},
	} {
		cfg.NATS.MaxAckPending = c.maxAckPending
		if got := holdRows(&cfg, 2); got != c.want {
			t.Errorf("max_ack_pending %d: HoldRows %d, want %d", c.maxAckPending, got, c.want)
		}
	}
	// No limit in messages and none in bytes: memory comes first.
	cfg.NATS.MaxAckPending = -1
	for _, set := range []func(*config.Config){
		func(c *config.Config) { c.NATS.PullClient = consumer.PullClientNATSGo },
		func(c *config.Config) { c.NATS.MaxInFlightBytes = -1 },
	} {
		c := cfg
		set(&c)
		if got := holdRows(&c, 2); got != 2*2*1024+500 {
			t.Errorf("pull client %q, max_in_flight_bytes %d: HoldRows %d, want what the rings and the pull buffer hold", c.NATS.PullClient, c.NATS.MaxInFlightBytes, got)
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
