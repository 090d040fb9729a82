package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// Chaos settings: how long faults are thrown, and the seed of their
// schedule. The defaults keep CI short; set JETSINK_TEST_CHAOS_DURATION (e.g.
// 10m) for a soak, and JETSINK_TEST_CHAOS_SEED to replay a schedule a failed run
// logged.
const (
	envChaosDuration = "JETSINK_TEST_CHAOS_DURATION"
	envChaosSeed     = "JETSINK_TEST_CHAOS_SEED"
)

// chaosFaults are the faults TestChaos picks from. Each one is over (the
// server back, jetsink running again) before the next starts, so that
// every state jetsink can be left in by one is met by the next.
var chaosFaults = []string{
	"kill-9",             // jetsink killed, started again
	"sigterm",            // jetsink drained and stopped, started again
	"postgres-crash",     // pg_ctl stop -m immediate, down 0.5-3 s
	"nats-restart",       // nats-server shut down for 0.5-3 s, same store
	"terminate-backends", // every jetsink connection killed by the server
	"lock-table",         // ACCESS EXCLUSIVE on the table for 0.5-3 s
}

// chaosInBatches is the rows of writeConfig's batches in flight at once:
// one per connection.
const chaosMaxAckPending, chaosInBatches = 4000, writeConnections * writeMaxRows

// chaosDups is what each fault can add as duplicates in at-least-once
// mode: rows whose commit outcome was unknown or whose acks were lost, at
// most the batches in flight (connections x max_rows); after a kill -9,
// two batches per connection (kill9Duplicates says why); when NATS loses
// acks, the messages in flight (max_ack_pending). A drain (SIGTERM) and a
// lock add none.
var chaosDups = map[string]int64{
	"kill-9":             kill9Duplicates,
	"sigterm":            0,
	"postgres-crash":     chaosInBatches,
	"nats-restart":       chaosMaxAckPending,
	"terminate-backends": chaosInBatches,
	"lock-table":         0,
}

// TestChaos runs jetsink, as its own process, through a random sequence of
// the faults above (each at least once), one every 0.5-2 s, while events are published at
// 2,000/s, and then checks every event: exactly one row in exactly-once
// mode, at least one in at-least-once mode (duplicates within chaosDups);
// none lost, and none dead-lettered, since every event is valid. jetsink
// must never exit by itself, and each SIGTERM must end with status 0. A
// fault comes only once jetsink has started (connecting at start-up is
// tried once; a process manager restarts it).
func TestChaos(t *testing.T) {
	dur := 20 * time.Second
	if v := os.Getenv(envChaosDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", envChaosDuration, v, err)
		}
		dur = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envChaosSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envChaosSeed, v, err)
		}
		seed = s
	}
	for i, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Logf("%s=%d replays this schedule", envChaosSeed, seed)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			testenv.Jetsink(t) // built before the load starts
			c := testenv.NewCluster(t)
			e := newEnvOn(t, &testenv.PG{URL: c.URL("postgres"), Cluster: c})
			ctx, cancel := context.WithTimeout(context.Background(), dur+5*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			// The publisher resends what a NATS restart left unacknowledged
			// when it is done; JetStream must still know their ids then.
			e.duplicateWindow(ctx, dur+5*time.Minute)
			cfgPath := e.writeConfig(mode,
				fmt.Sprintf("nats.max_ack_pending: %d", chaosMaxAckPending),
				"postgres.retry: {initial: 50ms, max: 500ms}")

			const rate = 2000
			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, int(rate*dur.Seconds()), rate, 100)
			ch := &chaos{e: e, rng: rng, cfgPath: cfgPath}
			ch.start(t, ctx)

			// The faults come in rounds of all of them in a random order,
			// and the run goes on past dur until every fault has come once:
			// a short run drawn at random could miss one (a 20 s run has
			// about 8).
			done := map[string]int{}
			var round []string
			for end := time.Now().Add(dur); time.Now().Before(end) || len(done) < len(chaosFaults); {
				time.Sleep(ch.between(500*time.Millisecond, 2*time.Second))
				ch.alive(t)
				if len(round) == 0 {
					round = slices.Clone(chaosFaults)
					rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
				}
				f := round[0]
				round = round[1:]
				ch.do(t, ctx, f)
				done[f]++
			}
			t.Logf("faults: %v", done)
			pub.wait(t, ctx)
			ch.alive(t)
			e.waitSettled(ctx, x)
			ch.stop(t)
			v := e.check(ctx, x)
			if v.dead != 0 {
				t.Errorf("%d valid events dead-lettered", v.dead)
			}
			var allowed int64
			for f, n := range done {
				allowed += int64(n) * chaosDups[f]
			}
			e.judge("chaos", mode, v, allowed)
		})
	}
}

// chaos is one TestChaos run: its env (on a cluster of its own), the
// schedule's random source and the jetsink process of the moment.
type chaos struct {
	e       *env
	rng     *rand.Rand
	cfgPath string
	p       *proc
}

func (ch *chaos) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(ch.rng.Int64N(int64(hi-lo)))
}

// start starts jetsink and waits until it runs (it has connected to both
// servers).
func (ch *chaos) start(t *testing.T, ctx context.Context) {
	t.Helper()
	ch.p = ch.e.spawn(ch.cfgPath)
	waitFor(t, ctx, "jetsink running", func() (bool, string) {
		ch.alive(t)
		return strings.Contains(ch.p.stderr.String(), "jetsink running"), "starting"
	})
}

// alive fails the test if jetsink has exited by itself.
func (ch *chaos) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-ch.p.done:
		ch.p.done <- err
		t.Fatalf("jetsink exited by itself (%v); output:\n%s", err, ch.p.stderr.String())
	default:
	}
}

// stop sends SIGTERM and requires a clean exit.
func (ch *chaos) stop(t *testing.T) {
	t.Helper()
	if err := ch.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := ch.p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit status %d, want 0; output:\n%s", code, ch.p.stderr.String())
	}
}

func (ch *chaos) do(t *testing.T, ctx context.Context, fault string) {
	t.Helper()
	e := ch.e
	switch fault {
	case "kill-9":
		if err := ch.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ch.p.wait(t, 10*time.Second)
		ch.start(t, ctx)
	case "sigterm":
		ch.stop(t)
		ch.start(t, ctx)
	case "postgres-crash":
		if err := e.pg.Cluster.Stop("immediate"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ch.between(500*time.Millisecond, 3*time.Second))
		if err := e.pg.Cluster.Start(); err != nil {
			t.Fatal(err)
		}
		e.db = e.pg.Conn(t) // the old one died with the server
	case "nats-restart":
		e.nats.Shutdown()
		time.Sleep(ch.between(500*time.Millisecond, 3*time.Second))
		if err := e.nats.Restart(); err != nil {
			t.Fatalf("restart nats: %v", err)
		}
	case "terminate-backends":
		if _, err := e.db.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"); err != nil {
			t.Fatalf("terminate backends: %v", err)
		}
	case "lock-table": // jetsink running has created the table
		tx := e.lockTable(ctx, e.db, "ACCESS EXCLUSIVE")
		time.Sleep(ch.between(500*time.Millisecond, 3*time.Second))
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("unlock table: %v", err)
		}
	default:
		panic(fmt.Sprintf("unknown fault %q", fault))
	}
}

// duplicateWindow sets the event stream's duplicate window (Nats-Msg-Id
// deduplication) to d.
func (e *env) duplicateWindow(ctx context.Context, d time.Duration) {
	e.t.Helper()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = d
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		e.t.Fatalf("set the duplicate window: %v", err)
	}
}
