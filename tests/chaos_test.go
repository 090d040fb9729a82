package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// TestChaos runs jetsink, as its own process, through a random sequence of
// the faults above, one every 0.5-2 s, while events are published at
// 2,000/s, and then checks every event: exactly one row in exactly-once mode,
// at least one in at-least-once mode, or a dead letter; none lost. jetsink
// must never exit by itself, and each SIGTERM must end with status 0.
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
			c := testenv.NewCluster(t)
			e := newEnvOn(t, &testenv.PG{URL: c.URL("postgres"), Cluster: c})
			ctx, cancel := context.WithTimeout(context.Background(), dur+5*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			cfgPath := e.writeConfig(mode,
				"nats.max_ack_pending: 4000",
				"postgres.retry: {initial: 50ms, max: 500ms}")

			const rate = 2000
			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, int(rate*dur.Seconds()), rate, 100)
			ch := &chaos{e: e, c: c, rng: rng, cfgPath: cfgPath, p: e.spawn(cfgPath)}

			done := map[string]int{}
			for end := time.Now().Add(dur); time.Now().Before(end); {
				time.Sleep(ch.between(500*time.Millisecond, 2*time.Second))
				ch.alive(t)
				f := chaosFaults[rng.IntN(len(chaosFaults))]
				ch.do(t, ctx, f)
				done[f]++
			}
			t.Logf("faults: %v", done)
			pub.wait(t, ctx)
			ch.alive(t)
			e.waitSettled(ctx, x)
			ch.stop(t)
			v := e.check(ctx, x)
			// At-least-once: a fault can duplicate at most the messages in
			// flight (max_ack_pending) whose rows had committed but whose
			// acks were lost.
			faults := 0
			for _, n := range done {
				faults += n
			}
			e.judge("chaos", mode, v, int64(faults)*4000)
		})
	}
}

// chaos is one TestChaos run: its servers, the schedule's random source and
// the jetsink process of the moment.
type chaos struct {
	e *env
	c interface {
		Stop(string) error
		Start() error
	}
	rng     *rand.Rand
	cfgPath string
	p       *proc
}

func (ch *chaos) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(ch.rng.Int64N(int64(hi-lo)))
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
		ch.p = e.spawn(ch.cfgPath)
	case "sigterm":
		ch.stop(t)
		ch.p = e.spawn(ch.cfgPath)
	case "postgres-crash":
		if err := ch.c.Stop("immediate"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ch.between(500*time.Millisecond, 3*time.Second))
		if err := ch.c.Start(); err != nil {
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
	case "lock-table":
		if e.tableRows(ctx) == 0 {
			return // not created yet: nothing to lock
		}
		tx, err := e.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{e.table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatalf("lock table: %v", err)
		}
		time.Sleep(ch.between(500*time.Millisecond, 3*time.Second))
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("unlock table: %v", err)
		}
	default:
		panic(fmt.Sprintf("unknown fault %q", fault))
	}
}
