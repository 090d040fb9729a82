package tests

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// Fault scenarios: each publishes while a fault happens, lets the fault
// heal, waits until the stream has drained, and hands the table and the
// dead-letter stream to the checker (checker_test.go). Each logs a line
// starting with SUMMARY with its counts.

var modes = []sink.Mode{sink.AtLeastOnce, sink.ExactlyOnce}

// faultConfig is e.config with short retries, so that a scenario spends its
// time on the fault, not on backoff.
func (e *env) faultConfig(mode sink.Mode) config.Config {
	cfg := e.config(mode)
	cfg.Postgres.Retry = sink.RetryConfig{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	return cfg
}

// outageAckPending is nats.max_ack_pending in the outage scenarios (a NATS
// restart or failover, a PostgreSQL crash or failover): what bounds their
// duplicates (outageAllowance), well below the events each publishes.
const outageAckPending = 1000

// outageConfig is faultConfig with max_ack_pending outageAckPending.
func (e *env) outageConfig(mode sink.Mode) config.Config {
	cfg := e.faultConfig(mode)
	cfg.NATS.MaxAckPending = outageAckPending
	return cfg
}

// outageAllowance is the at-least-once duplicates allowed in a run with
// outages outages: what the sink counted as possibly duplicated and the
// redeliveries the consumer counted (an ack lost with the server, an event
// held past ack_wait), but at most outageAckPending an outage. Every such
// duplicate is of a message delivered and not yet acked when the outage
// began, and JetStream delivers no more than max_ack_pending of those;
// once the outage is over, acks reach it again. The cap is what makes the
// check able to fail: a regression that lost acks would raise the
// redeliveries, and with them the rest of the allowance, as much as the
// duplicates.
func outageAllowance(st sink.Stats, cs consumer.Stats, outages int) int64 {
	return min(sinkAllowance(st)+int64(cs.Redelivered), int64(outages)*outageAckPending)
}

func (e *env) exec(ctx context.Context, sql string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) tableID() string { return pgx.Identifier{e.table}.Sanitize() }

// 5) A poison row: a CHECK constraint that one event in 10,000 violates. The
// good rows are committed, the poison rows dead-lettered with SQLSTATE
// 23514, stage sink.
func TestFaultPoisonRow(t *testing.T) {
	const events = 20_000
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e.createStreams(ctx)
			r := e.start(ctx, e.faultConfig(mode)) // creates the table
			e.exec(ctx, "ALTER TABLE "+e.tableID()+" ADD CONSTRAINT poison CHECK (seq % 10000 <> 1234)")

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 8000, 100)
			v := e.finish(t, ctx, pub, x, r)
			wantDead := map[uint64]bool{}
			for s := range x.seqs {
				if s%10000 == 1234 {
					wantDead[s] = true
				}
			}
			if len(v.deadLetters) != len(wantDead) {
				t.Errorf("%d dead letters, want %d", len(v.deadLetters), len(wantDead))
			}
			for _, d := range v.deadLetters {
				if wrong := wrongKind(d, pipeline.StageSink, "constraint", "23514"); wrong != "" {
					t.Errorf("dead letter %d: %s", d.seq, wrong)
				}
			}
			if n := e.count(ctx, "SELECT count(*) FROM "+e.tableID()+" WHERE seq % 10000 = 1234"); n != 0 {
				t.Errorf("%d poison rows in the table", n)
			}
			st := r.p.Sink().Stats()
			t.Logf("sink: %d bisect COPYs, %d dead-lettered", st.BisectCopies, st.DeadLettered)
			e.judge("5 poison row (CHECK 23514)", mode, v, sinkAllowance(st))
		})
	}
}

// wrongKind is what is wrong with dead letter d, "" if nothing: it must
// have stage, code and SQLSTATE sqlState ("" for none: a letter of the
// decode stage has none).
func wrongKind(d deadLetter, stage, code, sqlState string) string {
	if d.get(consumer.HeaderStage) == stage && d.get(consumer.HeaderCode) == code && d.get(consumer.HeaderSQLState) == sqlState {
		return ""
	}
	return fmt.Sprintf("%s, want stage %s code %s sqlstate %q", letterWhy(d), stage, code, sqlState)
}

// malformed is one kind of bad input and the Jetsink-Code it must get.
type malformed struct {
	name string
	code string
	data []byte
}

// badMsg is an event of kind m under Nats-Msg-Id id, on a subject of its
// own (<prefix>.bad.<name>) and with an X-Test header naming it, which its
// dead letter must carry on.
func (e *env) badMsg(m malformed, id string) *nats.Msg {
	return &nats.Msg{Subject: e.prefix + ".bad." + m.name, Data: m.data,
		Header: nats.Header{jetstream.MsgIDHeader: {id}, "X-Test": {m.name}}}
}

func malformedInputs() []malformed {
	good := `"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","ts":"2026-11-29T00:00:00Z"`
	return []malformed{
		{"truncated-json", pipeline.CodeInvalidJSON, []byte(`{"id":`)},
		{"not-json", pipeline.CodeInvalidJSON, []byte(`hello`)},
		{"raw-nul-in-string", pipeline.CodeInvalidJSON, []byte("{" + good + ",\"device\":\"a\x00b\"}")},
		{"wrong-type-bool", pipeline.CodeWrongType, []byte(`{` + good + `,"seq":true}`)},
		{"wrong-type-object", pipeline.CodeWrongType, []byte(`{` + good + `,"value":{"x":1}}`)},
		{"wrong-format-int", pipeline.CodeInvalidFormat, []byte(`{` + good + `,"seq":"abc"}`)},
		{"bad-uuid", pipeline.CodeInvalidFormat, []byte(`{"id":"nope","ts":"2026-11-29T00:00:00Z"}`)},
		{"missing-id", pipeline.CodeRequiredMissing, []byte(`{"ts":"2026-11-29T00:00:00Z","seq":-1}`)},
		{"null-ts", pipeline.CodeRequiredMissing, []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","ts":null}`)},
		{"nul-escape-in-text", pipeline.CodeNULInText, []byte(`{` + good + `,"device":"a\u0000b"}`)},
		{"invalid-utf8", pipeline.CodeInvalidUTF8, []byte("{" + good + ",\"device\":\"a\xff\xfeb\"}")},
		{"too-large", pipeline.CodeTooLarge, []byte(`{` + good + `,"pad":"` + strings.Repeat("x", 5000) + `"}`)},
		{"int8-out-of-range", pipeline.CodeOutOfRange, []byte(`{` + good + `,"seq":9223372036854775808}`)},
		{"float8-out-of-range", pipeline.CodeOutOfRange, []byte(`{` + good + `,"value":1e400}`)},
		{"int-with-exponent", pipeline.CodeWrongType, []byte(`{` + good + `,"seq":1e30}`)},
		// RFC 3339 has four-digit years, so a timestamp beyond
		// PostgreSQL's range (294276 AD) cannot be written in it.
		{"ts-year-99999", pipeline.CodeInvalidFormat, []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","ts":"99999-01-01T00:00:00Z"}`)},
		{"ts-number", pipeline.CodeWrongType, []byte(`{"id":"3f0c9a2e-1b7d-4c8e-9f00-0123456789ab","ts":1732838400}`)},
	}
}

// 6) Malformed input mixed into valid traffic: each kind is dead-lettered
// with its Jetsink-Code and stage decode, body and headers intact; the rest
// is stored.
func TestFaultMalformedInput(t *testing.T) {
	const events, copies = 10_000, 3
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e.createStreams(ctx)
			cfg := e.faultConfig(mode)
			cfg.Pipeline.MaxEventBytes = 4096
			r := e.start(ctx, cfg)

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 8000, 100)
			bad := map[string]malformed{} // by Nats-Msg-Id
			for i := range copies {
				for _, m := range malformedInputs() {
					id := fmt.Sprintf("bad-%s-%d", m.name, i)
					if _, err := e.js.PublishMsg(ctx, e.badMsg(m, id)); err != nil {
						t.Fatalf("publish %s: %v", id, err)
					}
					bad[id] = m
					x.other[id] = true
				}
				time.Sleep(200 * time.Millisecond) // spread the copies over the valid traffic, not a wait for a condition
			}
			v := e.finish(t, ctx, pub, x, r)
			got := 0
			for _, d := range v.deadLetters {
				id := d.get(consumer.HeaderOrigMsgID)
				m, ok := bad[id]
				if !ok {
					t.Errorf("dead letter %d for %q, which was valid", d.seq, id)
					continue
				}
				got++
				if wrong := wrongKind(d, pipeline.StageDecode, m.code, ""); wrong != "" {
					t.Errorf("%s: %s", m.name, wrong)
				}
				if !bytes.Equal(d.data, m.data) || d.get("X-Test") != m.name ||
					d.get(consumer.HeaderSubject) != e.prefix+".bad."+m.name || d.get(consumer.HeaderStreamSeq) == "" {
					t.Errorf("%s: dead letter does not carry the original body, headers and subject: %v", m.name, d.header)
				}
			}
			if got != len(bad) {
				t.Errorf("%d malformed events dead-lettered, want %d", got, len(bad))
			}
			e.judge(fmt.Sprintf("6 malformed input (%d kinds)", len(malformedInputs())), mode, v, sinkAllowance(r.p.Sink().Stats()))
		})
	}
}

// 8) Serialization failures and deadlocks raised by a trigger on the first
// statements (counted by a sequence, which a rollback does not undo): the
// batches are retried, nothing is lost, the retries are counted.
func TestFaultSerializationFailure(t *testing.T) {
	const events, failures = 10_000, 6
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e.createStreams(ctx)
			r := e.start(ctx, e.faultConfig(mode))
			e.exec(ctx, "CREATE SEQUENCE fault_n")
			e.exec(ctx, fmt.Sprintf(`CREATE FUNCTION fault_inject() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n bigint := nextval('fault_n');
BEGIN
  IF n <= %d THEN RAISE EXCEPTION 'injected serialization failure %%', n USING ERRCODE = '40001'; END IF;
  IF n <= %d THEN RAISE EXCEPTION 'injected deadlock %%', n USING ERRCODE = '40P01'; END IF;
  RETURN NULL;
END $$`, failures/2, failures))
			e.exec(ctx, "CREATE TRIGGER fault_inject BEFORE INSERT ON "+e.tableID()+" FOR EACH STATEMENT EXECUTE FUNCTION fault_inject()")

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 8000, 100)
			v := e.finish(t, ctx, pub, x, r)
			st := r.p.Sink().Stats()
			fired := e.count(ctx, "SELECT last_value FROM fault_n")
			t.Logf("trigger fired %d times; sink retries %d, dead-lettered %d", fired, st.Retries, st.DeadLettered)
			if st.Retries < failures {
				t.Errorf("sink counted %d retries, want at least %d", st.Retries, failures)
			}
			e.judgeValid("8 40001/40P01 trigger", mode, v, sinkAllowance(st))
		})
	}
}

// 3) pg_terminate_backend on the sink's connections while they COPY: the
// batch is retried on a new connection. Only a backend running a COPY of
// the sink's is terminated (as pg_stat_activity, read at the statement's
// start, shows it), so every kill counted is one mid-COPY.
func TestFaultTerminateBackend(t *testing.T) {
	const events, kills = 12_000, 5
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e.createStreams(ctx)
			cfg := e.faultConfig(mode)
			r := e.start(ctx, cfg)

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 4000, 100)
			killed := 0
			var lastKill time.Time
		loop:
			for killed < kills {
				select {
				case err := <-pub.done:
					pub.done <- err
					break loop
				default:
				}
				if time.Since(lastKill) < 200*time.Millisecond {
					time.Sleep(5 * time.Millisecond) // pacing between kills, not a wait for a condition
					continue
				}
				var n int
				// A batch's Query holds its COPY between type guards.
				err := e.db.QueryRow(ctx, `SELECT count(*) FROM (
  SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
  WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()
    AND state = 'active' AND query ILIKE '%copy % from stdin%') k WHERE ok`, cfg.Postgres.AppName).Scan(&n)
				if err != nil {
					t.Fatalf("terminate: %v", err)
				}
				if n > 0 {
					killed += n
					lastKill = time.Now()
				}
			}
			v := e.finish(t, ctx, pub, x, r)
			st := r.p.Sink().Stats()
			t.Logf("terminated %d backends mid-COPY; sink retries %d, possible duplicates %d", killed, st.Retries, st.PossibleDuplicates)
			if killed == 0 {
				t.Errorf("no backend caught mid-COPY; the scenario did not happen")
			}
			e.judgeValid("3 pg_terminate_backend", mode, v, sinkAllowance(st))
		})
	}
}

// 4) The NATS server stops and restarts on the same store while events are
// published and consumed. Acks sent just before the stop may be lost with
// it, so in at-least-once mode the allowance includes the redeliveries the
// consumer counted, up to max_ack_pending (outageAllowance).
func TestFaultNATSRestart(t *testing.T) {
	const events = 10_000
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			r := e.start(ctx, e.outageConfig(mode))

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 2500, 100)
			waitFor(t, ctx, "some rows before the restart", func() (bool, string) {
				n := e.rows(ctx)
				return n >= events/5, fmt.Sprintf("%d rows", n)
			})
			e.nats.Shutdown()
			time.Sleep(2 * time.Second) // the outage itself
			if err := e.nats.Restart(); err != nil {
				t.Fatalf("restart nats: %v", err)
			}
			v := e.finish(t, ctx, pub, x, r)
			st, cs := r.p.Sink().Stats(), r.p.Consumer().Stats()
			t.Logf("consumer: %d redelivered, %d resubscribes, %d missed heartbeats; sink ack errors %d",
				cs.Redelivered, cs.Resubscribes, cs.HeartbeatsMissing, st.AckErrors)
			e.judgeValid("4 NATS restart", mode, v, outageAllowance(st, cs, 1))
		})
	}
}

// 4b) A three-node NATS cluster, the stream and its consumer replicated on
// all three, as production runs them. While events are published and
// consumed, the node leading the consumer is killed (SIGKILL: no
// leadership handed over, the others elect a leader after their election
// timeout) and comes back; then the node jetsink's connection is on goes
// through lame duck mode and is restarted, a rolling upgrade's step (it
// closes its listener seconds before its clients). jetsink follows: every
// event lands, none is
// dead-lettered, exactly-once takes none twice, at-least-once no more than
// the commits it counted as uncertain and the redeliveries, up to
// max_ack_pending an outage (outageAllowance).
func TestFaultNATSClusterFailover(t *testing.T) {
	const events, rate = 24_000, 1500.0
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			cl := testenv.NewNATSCluster(t, 3)
			e := newClusterEnv(t, cl)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			for _, sc := range []jetstream.StreamConfig{
				// A duplicate window past the test's deadline: the
				// publishes sent again below are stored once whenever
				// they come.
				{Name: e.stream, Subjects: []string{e.prefix + ".>"}, Replicas: 3, Duplicates: 10 * time.Minute},
				{Name: e.dlqStream(), Subjects: []string{"dlq." + e.stream}, Replicas: 3},
			} {
				if _, err := e.js.CreateStream(ctx, sc); err != nil {
					t.Fatalf("create stream %s: %v", sc.Name, err)
				}
			}
			cfg := e.outageConfig(mode)
			cfg.NATS.CreateStream = false
			r := e.start(ctx, cfg)
			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, rate, 100)

			// consumerLeader waits for the consumer's leader (none while
			// one is elected) and returns its node.
			consumerLeader := func() int {
				leader := -1
				waitFor(t, ctx, "a consumer leader", func() (bool, string) {
					c, err := e.js.Consumer(ctx, e.stream, cfg.NATS.Consumer)
					if err != nil {
						return false, err.Error()
					}
					info, err := c.Info(ctx)
					if err != nil {
						return false, err.Error()
					}
					if info.Cluster == nil {
						return false, "no cluster in the consumer's info"
					}
					leader = cl.Node(info.Cluster.Leader)
					return leader >= 0, fmt.Sprintf("leader %q", info.Cluster.Leader)
				})
				return leader
			}
			waitRows := func(n int64) {
				waitFor(t, ctx, fmt.Sprintf("%d rows", n), func() (bool, string) {
					got := e.rows(ctx)
					return got >= n, fmt.Sprintf("%d rows", got)
				})
			}

			waitRows(events / 6)
			crashed := consumerLeader()
			t.Logf("killing %s, the consumer's leader", cl.Name(crashed))
			cl.Kill(crashed)
			time.Sleep(2 * time.Second) // the outage itself
			if err := cl.Restart(crashed); err != nil {
				t.Fatalf("restart %s: %v", cl.Name(crashed), err)
			}

			waitRows(events / 2)
			ducked := -1
			waitFor(t, ctx, "jetsink connected", func() (bool, string) {
				ducked = cl.NodeOf(r.p.Consumer().Server())
				return ducked >= 0, r.p.Consumer().Server()
			})
			t.Logf("lame duck mode for %s, the server jetsink is connected to", cl.Name(ducked))
			if err := cl.LameDuck(ctx, ducked); err != nil {
				t.Fatalf("lame duck %s: %v", cl.Name(ducked), err)
			}
			if err := cl.Restart(ducked); err != nil {
				t.Fatalf("restart %s: %v", cl.Name(ducked), err)
			}

			// Publishes in flight to the killed node, or sent while the
			// stream elected a leader, may have got no PubAck after every
			// retry: a publisher sends them again, and the duplicate
			// window stores each event once.
			select {
			case err := <-pub.done:
				t.Logf("publisher: %v (%+v)", err, pub.res)
			case <-ctx.Done():
				t.Fatalf("publisher did not finish: %v", ctx.Err())
			}
			e.publish(ctx, 0, events, 100)
			e.waitSettled(ctx, x)
			r.drain(t)
			v := e.check(ctx, x)
			st, cs := r.p.Sink().Stats(), r.p.Consumer().Stats()
			t.Logf("consumer: %d redelivered, %d resubscribes, %d missed heartbeats; sink ack errors %d, possible duplicates %d",
				cs.Redelivered, cs.Resubscribes, cs.HeartbeatsMissing, st.AckErrors, st.PossibleDuplicates)
			e.judgeValid("4b NATS cluster failover", mode, v, outageAllowance(st, cs, 2)) // the kill, the lame duck
		})
	}
}

// 2b) PostgreSQL fails over: the primary, whose synchronous standby streams
// every commit, crashes while batches commit, and the standby is promoted
// 3 s later. jetsink's postgres.url names both servers with
// target_session_attrs=read-write, as libpq users follow a failover: it
// finds the new primary by itself, and every event is there, once in
// exactly-once mode (a commit the crash cut off before its answer may or
// may not have reached the standby: retried, ON CONFLICT takes what is
// there already).
func TestFaultPostgresFailover(t *testing.T) {
	const events, outage = 10_000, 3 * time.Second
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			primary := testenv.NewCluster(t)
			standby := testenv.NewStandby(t, primary)
			e := newEnvOn(t, &testenv.PG{URL: testenv.FailoverURL("postgres", primary, standby)})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			r := e.start(ctx, e.outageConfig(mode))

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 1000, 100)
			waitFor(t, ctx, "some rows before the crash", func() (bool, string) {
				n := e.rows(ctx)
				return n >= events/5, fmt.Sprintf("%d rows", n)
			})
			// On one machine an asynchronous standby keeps up too: the
			// test is of a synchronous one.
			var sync string
			if err := e.db.QueryRow(ctx, "SELECT string_agg(sync_state, ',') FROM pg_stat_replication").Scan(&sync); err != nil || sync != "sync" {
				t.Fatalf("the standby's sync_state: %q, %v; want sync", sync, err)
			}
			if err := primary.Stop("immediate"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(outage) // no server takes writes
			if err := standby.Promote(); err != nil {
				t.Fatal(err)
			}
			e.db = e.pg.Conn(t) // the old one died with the primary
			v := e.finish(t, ctx, pub, x, r)
			st, cs := r.p.Sink().Stats(), r.p.Consumer().Stats()
			t.Logf("sink: retries %d, possible duplicates %d; consumer: %d redelivered",
				st.Retries, st.PossibleDuplicates, cs.Redelivered)
			e.judgeValid("2b postgres failover", mode, v, outageAllowance(st, cs, 1))
		})
	}
}

// 2) PostgreSQL crashes (pg_ctl stop -m immediate) while batches commit and
// comes back after 10s, as long as ack_wait.
func TestFaultPostgresCrash(t *testing.T) {
	const events, outage = 10_000, 10 * time.Second
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			c := testenv.NewCluster(t)
			e := newEnvOn(t, &testenv.PG{URL: c.URL("postgres"), Cluster: c})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e.createStreams(ctx)
			r := e.start(ctx, e.outageConfig(mode))

			x := newExpected()
			pub := e.publishDuring(ctx, x, 0, events, 1000, 100)
			waitFor(t, ctx, "some rows before the crash", func() (bool, string) {
				n := e.rows(ctx)
				return n >= events/5, fmt.Sprintf("%d rows", n)
			})
			if err := c.Stop("immediate"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(outage) // the outage itself
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			e.db = e.pg.Conn(t) // the old one died with the server
			v := e.finish(t, ctx, pub, x, r)
			st, cs := r.p.Sink().Stats(), r.p.Consumer().Stats()
			t.Logf("sink: retries %d, possible duplicates %d, in-progress sent %d; consumer: %d redelivered",
				st.Retries, st.PossibleDuplicates, st.InProgress, cs.Redelivered)
			// Events whose ack was lost with a commit whose outcome was
			// unknown, or that sat in the pull buffer past ack_wait before
			// the stall was declared, can be redelivered; at-least-once mode
			// stores both copies. The consumer counts those redeliveries
			// (outageAllowance).
			e.judgeValid("2 postgres crash (10s)", mode, v, outageAllowance(st, cs, 1))
		})
	}
}
