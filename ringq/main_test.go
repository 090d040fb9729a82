package ringq

import (
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
	}
}

// parked reports whether a waiter sleeps on n.
func parked(n *notifier) bool { return n.sleepers.Load() > 0 }

// stillParked fails the test unless the waiter parked on n stays parked for
// 50 ms: one that spins through its re-check (a wake-up condition that is
// wrongly true) leaves the sleeper count at 0 for part of each turn, which
// a sample taken in a tight loop sees.
func stillParked(t *testing.T, n *notifier) {
	t.Helper()
	for end, i := time.Now().Add(50*time.Millisecond), 0; time.Now().Before(end); i++ {
		if n.sleepers.Load() == 0 {
			t.Fatalf("the waiter left its park (sample %d): it spins", i)
		}
		if i%1024 == 0 {
			runtime.Gosched()
		}
	}
}
