package ringq

import (
	"context"
	"testing"
)

// TestHotPathsDoNotAllocate guards the 0 allocs/op of the benchmarks, with
// the misuse checks off and on (race builds turn them on whatever the option
// says, and run this test too).
func TestHotPathsDoNotAllocate(t *testing.T) {
	for _, debug := range []bool{false, true} {
		hotPathsDoNotAllocate(t, debug)
	}
}

func hotPathsDoNotAllocate(t *testing.T, debug bool) {
	ctx := context.Background()
	r := New[ev](64, WithDebug(debug))
	d := NewDispatch(2, 64, func(v *ev) uint64 { return v.key }, WithDebug(debug))
	m := NewMerge[ev](2, 64, WithDebug(debug))
	batch := make([]ev, 8)
	for name, f := range map[string]func(){
		"Ring.TryPush/TryPop": func() { r.TryPush(mkEv(1)); r.TryPop() },
		"Ring.Push/Pop": func() {
			_ = r.Push(ctx, mkEv(1))
			_, _ = r.Pop(ctx)
		},
		"Ring.PushN/PopN": func() {
			_, _ = r.PushN(ctx, batch)
			_, _ = r.PopN(ctx, batch)
		},
		"Dispatch.Push": func() {
			_ = d.Push(ctx, mkEv(3))
			d.Ring(1).TryPop()
		},
		"Merge.PopN": func() {
			m.Ring(1).TryPushN(batch)
			_, _ = m.PopN(ctx, batch)
		},
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s (debug %v): %v allocs per run, want 0", name, debug, n)
		}
	}
}
