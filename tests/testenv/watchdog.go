package testenv

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jetsink/jetsink/embedded"
)

// clusters are the PostgreSQL clusters this package started and has not
// destroyed yet. A test binary that panics at its -timeout, which ends it
// before Main's end and every t.Cleanup, takes each server down with it
// (embedded starts it with a death signal) but leaves its directory until
// a later StartPostgres sweeps it. The watchdog destroys them before
// that, and prints the goroutines' stacks.
var clusters struct {
	mu   sync.Mutex
	live map[*embedded.Cluster]bool
	shut bool // the watchdog has run: a cluster started since is destroyed at once
}

// errTimeoutNear: the watchdog has run, and a cluster started since would
// outlive the test binary.
var errTimeoutNear = errors.New("the test binary's -timeout is near, and its PostgreSQL clusters are stopped")

// keep records c, just started, for the watchdog. Once the watchdog has
// run, it destroys c instead and returns errTimeoutNear.
func keep(c *embedded.Cluster) error {
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	if clusters.shut {
		_ = c.Destroy()
		return errTimeoutNear
	}
	if clusters.live == nil {
		clusters.live = make(map[*embedded.Cluster]bool)
	}
	clusters.live[c] = true
	return nil
}

// destroy destroys c and forgets it. (Destroying a cluster twice, here
// and by the watchdog, is harmless: the second finds nothing to stop.)
func destroy(c *embedded.Cluster) error {
	err := c.Destroy()
	clusters.mu.Lock()
	delete(clusters.live, c)
	clusters.mu.Unlock()
	return err
}

// startWatchdog arranges for the clusters to be destroyed shortly before
// the test binary's -test.timeout runs out (a tenth of it before, 20 s at
// most), and returns the timer; nil without a timeout. The flags must have
// been parsed.
func startWatchdog() *time.Timer {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return nil
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return nil
	}
	timeout, _ := g.Get().(time.Duration)
	if timeout <= 0 {
		return nil
	}
	margin := min(timeout/10, 20*time.Second)
	return time.AfterFunc(timeout-margin, func() { stopClusters(margin) })
}

// stopClusters destroys every cluster kept, and any started from now on.
// It first writes every goroutine's stack, as the timeout's panic will:
// a test hung on the database may fail instead once it is gone, and the
// panic, with the stacks, would then not come.
func stopClusters(margin time.Duration) {
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	clusters.shut = true
	if len(clusters.live) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "testenv: the test binary's -timeout runs out in %v: destroying the %d PostgreSQL clusters it started, which would outlive its panic (a test still using one fails from now on); every goroutine now:\n",
		margin, len(clusters.live))
	_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
	// All at once: one whose server will not stop (pg_ctl waits up to
	// 30 s) must not use up the margin of the others.
	var wg sync.WaitGroup
	for c := range clusters.live {
		wg.Go(func() {
			if err := c.Destroy(); err != nil {
				fmt.Fprintf(os.Stderr, "testenv: destroy PostgreSQL cluster: %v\n", err)
			}
		})
	}
	wg.Wait()
	clusters.live = nil
}
