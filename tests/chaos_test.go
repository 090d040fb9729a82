package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/pipeline"
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

// chaosBadEvery is how often TestChaos publishes an event that cannot be
// decoded: 10 a second beside 2,000 valid ones.
const chaosBadEvery = 100 * time.Millisecond

// chaosPreStored is how many undecodable events TestChaos publishes
// before jetsink starts, each with its dead letter stored already
// (preStoreLetters).
const chaosPreStored = 3

// chaosSinkPoison reports whether TestChaos's CHECK constraint (seq % 1000
// <> 123) refuses loadgen event seq: one in 1,000.
func chaosSinkPoison(seq uint64) bool { return seq%1000 == 123 }

// TestChaos runs jetsink, as its own process, through a random sequence of
// the faults above (each at least once), one every 0.5-2 s, while events are
// published at 2,000/s, and then checks every event by its kind
// (chaosCheckEach): a valid one is exactly one row in exactly-once mode, at
// least one in at-least-once mode (duplicates within chaosDups), and no dead
// letter; a poison one, refused by a CHECK constraint (one in 1,000) or
// undecodable (10 a second, and chaosPreStored whose letters are stored
// before jetsink starts), no row and exactly one dead letter with its
// stage and code. Nothing is lost, and nothing else is in the table or the
// dead-letter stream. jetsink must never exit by itself, and each SIGTERM
// must end with status 0. A fault comes only once jetsink has started
// (connecting at start-up is tried once; a process manager restarts it).
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
			// The publishers resend what a NATS restart left unacknowledged
			// when it is done; JetStream must still know their ids then.
			e.duplicateWindow(ctx, e.stream, dur+5*time.Minute)
			// An event's dead letters after its first are dropped as
			// duplicates within the dead-letter stream's window of the
			// first: over the whole run, one letter per event
			// (chaosCheckEach).
			e.duplicateWindow(ctx, e.dlqStream(), dur+5*time.Minute)
			x := newExpected()
			pre := e.preStoreLetters(ctx, x, chaosPreStored)
			cfgPath := e.writeConfig(mode,
				fmt.Sprintf("nats.max_ack_pending: %d", chaosMaxAckPending),
				"postgres.retry: {initial: 50ms, max: 500ms}")
			ch := &chaos{e: e, rng: rng, cfgPath: cfgPath}
			ch.start(t, ctx) // makes the table, for the CHECK
			e.exec(ctx, "ALTER TABLE "+e.tableID()+" ADD CONSTRAINT poison CHECK (seq % 1000 <> 123)")

			const rate = 2000
			n := int(rate * dur.Seconds())
			pub := e.publishDuring(ctx, x, 0, n, rate, 100)
			bad := e.publishBadDuring(ctx, dur, chaosBadEvery)

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
			bad.wait(t, ctx, x)
			ch.alive(t)
			e.settleBehindTrickle(ctx, x, uint64(n))
			ch.stop(t)
			v := e.check(ctx, x)
			chaosCheckEach(t, v, x, bad.sent, pre)
			var allowed int64
			for f, n := range done {
				allowed += int64(n) * chaosDups[f]
			}
			e.judge("chaos", mode, v, allowed)
		})
	}
}

// chaosCheckEach checks TestChaos's events one by one, each by its kind: a
// valid event has no dead letter (its rows: check and judge); a poison one
// (bad and pre: the undecodable ones' Nats-Msg-Ids and codes) no row and
// exactly one dead letter, of its stage and code.
//
// Exactly one in both modes, not a bound from the faults as for rows: a
// letter goes out under Nats-Msg-Id <stream>:<seq>:<store time>:<consumer>,
// so the dead-letter stream keeps one per event however often the event
// comes back (a kill -9 between the letter's PubAck and the term, a term or
// a PubAck lost in a NATS restart: the event is delivered again and its
// letter dropped as a duplicate) as long as each comes within the stream's
// duplicate window of the first (README, "Dead letters"). TestChaos's
// window spans the run, so neither exception the README names (a letter
// after the window, a dead-letter stream made again) can arise: a second
// letter is a bug. The faults rarely bring a letter back (one must land
// between its PubAck and its term); pre's letters come back every run.
func chaosCheckEach(t *testing.T, v verdict, x *expected, bad, pre map[string]string) {
	t.Helper()
	var problems []string
	var valid, refused int
	for s := range x.seqs {
		key := "seq:" + strconv.FormatUint(s, 10)
		rows, letters := v.rowsOf[key], v.lettersOf[key]
		if !chaosSinkPoison(s) {
			valid++
			if len(letters) != 0 {
				problems = append(problems, fmt.Sprintf("valid seq %d: %d dead letters (%s)", s, len(letters), letterWhy(letters[0])))
			}
			continue
		}
		refused++
		if rows != 0 {
			problems = append(problems, fmt.Sprintf("seq %d, which the CHECK refuses: %d rows", s, rows))
		}
		problems = append(problems, oneLetter(fmt.Sprintf("seq %d, which the CHECK refuses", s), letters, pipeline.StageSink, "constraint", "23514")...)
	}
	for id, code := range bad {
		problems = append(problems, oneLetter("undecodable "+id, v.lettersOf["msg:"+id], pipeline.StageDecode, code, "")...)
	}
	for id, code := range pre {
		what := "undecodable " + id + ", its letter stored before jetsink started"
		letters := v.lettersOf["msg:"+id]
		if p := oneLetter(what, letters, pipeline.StageDecode, code, ""); p != nil {
			problems = append(problems, p...)
		} else if r := letters[0].get(consumer.HeaderReason); r != preStoredReason {
			// The one kept must be the test's: else jetsink's letter is the
			// only one, and the repeat was never put to the test.
			problems = append(problems, fmt.Sprintf("%s: the letter kept is %q, not the one stored before", what, r))
		}
	}
	t.Logf("checked one by one: %d valid events, %d refused by the CHECK, %d undecodable (%d with their letters stored before)",
		valid, refused, len(bad)+len(pre), len(pre))
	if len(problems) > 0 {
		sort.Strings(problems)
		t.Errorf("%d events not what their kind requires, first: %s", len(problems), strings.Join(first(problems, 10), "; "))
	}
}

// oneLetter is what is wrong with letters, the dead letters of the poison
// event what: anything but one letter, of stage, code and sqlState
// (wrongKind).
func oneLetter(what string, letters []deadLetter, stage, code, sqlState string) []string {
	if len(letters) != 1 {
		var whys []string
		for _, d := range letters {
			whys = append(whys, letterWhy(d))
		}
		return []string{fmt.Sprintf("%s: %d dead letters, want 1 %v", what, len(letters), whys)}
	}
	if wrong := wrongKind(letters[0], stage, code, sqlState); wrong != "" {
		return []string{fmt.Sprintf("%s: dead letter of %s", what, wrong)}
	}
	return nil
}

func letterWhy(d deadLetter) string {
	return fmt.Sprintf("stage %s code %s sqlstate %q delivered %s (dead-letter seq %d, %q)", d.get(consumer.HeaderStage),
		d.get(consumer.HeaderCode), d.get(consumer.HeaderSQLState), d.get(consumer.HeaderDelivered), d.seq, d.get(consumer.HeaderReason))
}

// chaosBadKinds are the undecodable events TestChaos publishes:
// malformedInputs but too-large, a valid event under writeConfig's
// max_event_bytes.
func chaosBadKinds() []malformed {
	var kinds []malformed
	for _, m := range malformedInputs() {
		if m.code != pipeline.CodeTooLarge {
			kinds = append(kinds, m)
		}
	}
	return kinds
}

// preStoreLetters publishes n undecodable events (chaosBadKinds in turn),
// adds them to x, and stores the dead letter of each in the dead-letter
// stream under the Nats-Msg-Id jetsink will give it, as if an earlier
// jetsink had stored it and then been killed before its term. It returns
// their Nats-Msg-Ids and codes. Called before jetsink starts: the letter
// jetsink then publishes for each is a repeat, which the dead-letter
// stream must drop (chaosCheckEach requires one letter). The faults make
// that case only when one lands in the sub-millisecond gap between a
// letter's PubAck and its term, so a letter id that changed with each
// delivery passed nearly every run; these make it certain.
func (e *env) preStoreLetters(ctx context.Context, x *expected, n int) map[string]string {
	e.t.Helper()
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	kinds := chaosBadKinds()
	pre := map[string]string{}
	for i := range n {
		m := kinds[i%len(kinds)]
		id := fmt.Sprintf("prestored-%s-%d", m.name, i)
		ack, err := e.js.PublishMsg(ctx, e.badMsg(m, id))
		if err != nil {
			e.t.Fatalf("publish %s: %v", id, err)
		}
		stored, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			e.t.Fatalf("read %s back (stream seq %d) for its store time: %v", id, ack.Sequence, err)
		}
		letter := &nats.Msg{Subject: "dlq." + e.stream, Data: m.data, Header: nats.Header{
			jetstream.MsgIDHeader:    {chaosLetterID(e.stream, ack.Sequence, stored.Time, "jetsink")}, // writeConfig's nats.consumer
			"X-Test":                 {m.name},
			consumer.HeaderOrigMsgID: {id},
			consumer.HeaderConsumer:  {"jetsink"},
			consumer.HeaderSubject:   {stored.Subject},
			consumer.HeaderStream:    {e.stream},
			consumer.HeaderStreamSeq: {strconv.FormatUint(ack.Sequence, 10)},
			consumer.HeaderDelivered: {"1"},
			consumer.HeaderStage:     {pipeline.StageDecode},
			consumer.HeaderCode:      {m.code},
			consumer.HeaderReason:    {preStoredReason},
		}}
		dack, err := e.js.PublishMsg(ctx, letter)
		if err != nil {
			e.t.Fatalf("store the dead letter of %s: %v", id, err)
		}
		if dack.Duplicate {
			e.t.Fatalf("store the dead letter of %s: JetStream took it for a duplicate of an earlier one", id)
		}
		pre[id] = m.code
		x.other[id] = true
	}
	return pre
}

// preStoredReason is the Jetsink-Reason of the letters TestChaos stores
// before jetsink starts.
const preStoredReason = "stored by TestChaos before jetsink started"

// chaosLetterID is the Nats-Msg-Id jetsink reading through durable gives
// the dead letter of stream's event seq, stored at stored. Package
// consumer exports no function for it: this mirrors the form README,
// "Dead letters", documents, <stream>:<seq>:<store time, Unix ns>:<consumer>.
func chaosLetterID(stream string, seq uint64, stored time.Time, durable string) string {
	return fmt.Sprintf("%s:%d:%d:%s", stream, seq, stored.UnixNano(), durable)
}

// badPublisher publishes undecodable events in the background.
type badPublisher struct {
	done chan error
	sent map[string]string // Nats-Msg-Id: the Jetsink-Code its letter must have; the publisher's until done
}

// publishBadDuring publishes an undecodable event (malformedInputs in turn,
// but too-large, a valid event under writeConfig's max_event_bytes) every
// every for d, each under a Nats-Msg-Id of its own. A publish that fails
// (NATS restarting) is sent again under its id until JetStream acknowledges
// it: the event stream's duplicate window keeps it once.
func (e *env) publishBadDuring(ctx context.Context, d, every time.Duration) *badPublisher {
	kinds := chaosBadKinds()
	p := &badPublisher{done: make(chan error, 1), sent: map[string]string{}}
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			m := kinds[i%len(kinds)]
			id := fmt.Sprintf("bad-%s-%d", m.name, i)
			msg := e.badMsg(m, id)
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := e.js.PublishMsg(pctx, msg)
				cancel()
				if err == nil {
					break
				}
				select {
				case <-ctx.Done():
					p.done <- fmt.Errorf("publish %s: %v (%v)", id, err, ctx.Err())
					return
				case <-time.After(100 * time.Millisecond): // NATS away: try again, not a wait for a condition
				}
			}
			p.sent[id] = m.code
			select {
			case <-ctx.Done():
				p.done <- ctx.Err()
				return
			case <-tick.C:
			}
		}
		p.done <- nil
	}()
	return p
}

// wait waits for the publisher, fails the test if it failed, and adds what
// it published to x.
func (p *badPublisher) wait(t *testing.T, ctx context.Context, x *expected) {
	t.Helper()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("undecodable events: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("undecodable events: not all published: %v", ctx.Err())
	}
	for id := range p.sent {
		x.other[id] = true
	}
}

// settleBehindTrickle waits until every event of x is settled while valid
// events (loadgen seqs from next, but those chaosSinkPoison refuses) are
// published behind them, ten a second, and then adds those to x and waits
// for them too. A row that a CHECK refuses is dead-lettered only once a
// commit that started after the refusal shows that the table takes rows
// (README, "Rows PostgreSQL refuses"): one delivered again after the
// publishers are done (a kill -9 before its letter, or a term lost) would
// be held, as documented, with nothing behind it to commit. The consumer
// empty (waitSettled) means that x's events are all acked or terminated.
func (e *env) settleBehindTrickle(ctx context.Context, x *expected, next uint64) {
	e.t.Helper()
	stop := make(chan struct{})
	sent := make(chan []uint64, 1)
	go func() {
		var seqs []uint64
		defer func() { sent <- seqs }()
		for s := next; ; s++ {
			if chaosSinkPoison(s) {
				continue
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond): // the trickle's pace
			}
			if res, err := loadgen.Publish(ctx, e.nc, loadgen.Options{Subject: e.prefix, Subjects: 1, Events: 1, Run: e.run, First: s}); err != nil {
				e.t.Errorf("trickle: publish seq %d: %+v: %v", s, res, err)
				return
			}
			seqs = append(seqs, s)
		}
	}()
	stopped := false
	defer func() {
		if !stopped { // a wait that failed the test: no trickle past it
			close(stop)
			<-sent
		}
	}()
	e.waitSettled(ctx, x)
	close(stop)
	stopped = true
	for _, s := range <-sent {
		x.seqs[s] = true
	}
	e.waitSettled(ctx, x)
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

// duplicateWindow sets stream's duplicate window (Nats-Msg-Id
// deduplication) to d.
func (e *env) duplicateWindow(ctx context.Context, stream string, d time.Duration) {
	e.t.Helper()
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = d
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		e.t.Fatalf("set the duplicate window: %v", err)
	}
}
