package ringq

// Default waiting policy. A waiter re-checks its condition defaultSpin times, then calls
// runtime.Gosched defaultYield times (re-checking after each), then parks on a channel.
const (
	defaultSpin  = 4
	defaultYield = 2
)

// Option configures a Ring, Dispatch or Merge. Options are applied in order; later ones win.
type Option func(*config)

type config struct {
	spin  int
	yield int
	debug bool

	// start, when hasStart is set, is the initial value of both indices (test hook for
	// wrap-around; see withStartIndex).
	start    uint64
	hasStart bool
}

func buildConfig(opts []Option) config {
	c := config{spin: defaultSpin, yield: defaultYield, debug: raceEnabled}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithSpin sets how many times a blocked Push or Pop re-checks the ring before it starts
// yielding the processor. 0 disables spinning; negative values count as 0. Default 4.
// Spinning only helps when the other side is running on another core at the same moment.
// A Merge's consumer never spins (its check reads every ring's tail); the option applies to
// the producers of its rings.
func WithSpin(n int) Option {
	return func(c *config) { c.spin = max(n, 0) }
}

// WithYield sets how many times a blocked Push or Pop calls runtime.Gosched (re-checking
// after each) before it parks. 0 disables yielding; negative values count as 0. Default 2.
// Once a wait has got as far as parking, that side's waits skip the yields for good, so a
// ring that sees an item now and then idles like a channel; single-item Push always yields
// first (see the package documentation, "Waiting").
func WithYield(n int) Option {
	return func(c *config) { c.yield = max(n, 0) }
}

// WithDebug turns on detection of single-producer/single-consumer misuse: a producer or
// consumer method entered while another call on the same side is still running panics
// with a message naming the side, instead of silently losing or duplicating items. It costs
// one atomic compare-and-swap and one store per call. It is always on when the program is
// built with the race detector (-race), whatever this option says.
func WithDebug(on bool) Option {
	return func(c *config) { c.debug = on || raceEnabled }
}

// withStartIndex starts both indices at i (reduced to the 63-bit index space). Tests use it
// to cross the index wrap-around within a few items.
func withStartIndex(i uint64) Option {
	return func(c *config) { c.start, c.hasStart = i&idxMask, true }
}

// withoutChecks turns the misuse checks off even in race-detector builds. Push and Pop skip
// their fast paths while the checks are on, so tests use it to run those paths under -race
// too.
func withoutChecks() Option {
	return func(c *config) { c.debug = false }
}
