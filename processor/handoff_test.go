package processor

import (
	"testing"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
)

// TestNewHandoffFollowsTheConfig: pipeline.handoff picks what Run wires
// between the stages, and the consumer pushes into that same hand-off.
func TestNewHandoffFollowsTheConfig(t *testing.T) {
	cfg := pipeline.DefaultConfig()
	cfg.Workers = 3
	cfg.RingSize = 100

	cfg.Handoff = pipeline.HandoffRing
	h, in := newHandoff(cfg)
	rh, ok := h.(*pipeline.RingHandoff)
	if !ok {
		t.Fatalf("ring: got %T", h)
	}
	if d, ok := in.(*ringq.Dispatch[pipeline.Event]); !ok || d != rh.In {
		t.Errorf("ring: the consumer pushes into %T, not the hand-off's Dispatch", in)
	}
	if h.N() != 3 || rh.In.Ring(0).Cap() != 128 {
		t.Errorf("ring: %d workers, capacity %d; want 3 and 128", h.N(), rh.In.Ring(0).Cap())
	}

	cfg.Handoff = pipeline.HandoffChannel
	h, in = newHandoff(cfg)
	ch, ok := h.(*pipeline.ChanHandoff)
	if !ok {
		t.Fatalf("channel: got %T", h)
	}
	if c, ok := in.(*pipeline.ChanHandoff); !ok || c != ch {
		t.Errorf("channel: the consumer pushes into %T, not the hand-off", in)
	}
	if h.N() != 3 {
		t.Errorf("channel: %d workers, want 3", h.N())
	}
}
