package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/tests/testenv"
)

// shortenOutage has c's outage watch log its first Error after d.
func shortenOutage(c *Consumer, d time.Duration) {
	c.outage.mu.Lock()
	defer c.outage.mu.Unlock()
	c.outage.after = d
}

// A NATS outage of minutes logged one Warn ("nats disconnected") and then
// nothing until the reconnect (Info): an alert on Error, which sees
// PostgreSQL's outages, missed it, with either pull client. Still
// disconnected after outageAfter (shortened here), the consumer logs an
// Error saying NATS is unreachable, for how long, and that the events
// wait in JetStream; the reconnect says how long it was away and how many
// attempts failed. No line carries the password of nats.url.
func TestNATSOutageLogsAnError(t *testing.T) {
	onePassOnly(t) // runs with each pull client
	for _, client := range []string{PullClientWire, PullClientNATSGo} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := testenv.NATS(t)
			cfg := testConfig(t, srv)
			cfg.PullClient = client
			cfg.URL = strings.Replace(cfg.URL, "nats://", "nats://jetsink:"+sentinel+"@", 1)
			c, buf := newJSONLogged(t, ctx, cfg)
			const after = 300 * time.Millisecond
			shortenOutage(c, after)
			publish(t, ctx, jsFor(t, srv), cfg, 1, 1, 0)
			r := startRun(t, ctx, c, 1, 64, 16)
			r.ackUntil(t, ctx, 0)

			srv.Shutdown()
			const unreachable = "NATS unreachable"
			waitFor(t, ctx, "the outage's Error", func() bool { return strings.Contains(buf.String(), unreachable) })
			if c.nc.IsConnected() {
				t.Fatal("connected while the server is down")
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, "the reconnect", func() bool { return strings.Contains(buf.String(), `"msg":"nats reconnected"`) })
			// Consuming again.
			publish(t, ctx, jsFor(t, srv), cfg, 1, 1, 1)
			r.ackUntil(t, ctx, 1)
			r.stopClean(t, ctx)
			_ = c.Close(context.Background())

			if strings.Contains(buf.String(), sentinel) {
				t.Fatalf("a log line carries the password:\n%s", buf.String())
			}
			recs := jsonRecords(t, buf.String())
			errs := records(recs, unreachable)
			if len(errs) != 1 { // the next is a minute later
				t.Fatalf("%d lines %q, want 1", len(errs), unreachable)
			}
			e := errs[0]
			if e["level"] != "ERROR" || !strings.Contains(e["msg"].(string), "the events wait in JetStream") ||
				e["unreachable_for"].(float64) < float64(after) || e["fix"] == nil || e["last_err"] == nil {
				t.Fatalf("the outage's line: %v; want an Error saying the events wait, with unreachable_for >= %v, last_err and fix", e, after)
			}
			var back []map[string]any
			for _, r := range recs {
				if r["msg"] == "nats reconnected" {
					back = append(back, r)
				}
			}
			if len(back) != 1 {
				t.Fatalf("%d reconnect lines, want 1", len(back))
			}
			if away, _ := back[0]["away_for"].(float64); away < float64(after) {
				t.Fatalf("the reconnect line's away_for: %v, want at least the %v before the Error: %v", back[0]["away_for"], after, back[0])
			}
			if n, _ := back[0]["reconnect_attempts"].(float64); n < 1 {
				t.Fatalf("the reconnect line's reconnect_attempts: %v, want the failed ones (>= 1): %v", back[0]["reconnect_attempts"], back[0])
			}
		})
	}
}

// A server that keeps coming back for moments (crash-looping, a flapping
// link) is one outage: each drop here lasts 20 ms, well under the watch's
// delay, and the connection is lost nearly all the time; the Error comes,
// counting the brief reconnects. Before, each reconnect ended the outage
// and the next drop started the clock again, so no Error ever came (a
// review's flapping server, down 94% of the time).
func TestNATSOutageCoversAFlappingServer(t *testing.T) {
	log, buf := jsonLog(t)
	o := &natsOutage{after: 200 * time.Millisecond}
	defer o.stop()
	const unreachable = "NATS unreachable"
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), unreachable) {
		if time.Now().After(deadline) {
			t.Fatalf("no Error after 5 s of a connection lost nearly all the time:\n%s", buf.String())
		}
		o.down(log)
		time.Sleep(20 * time.Millisecond) // the connection is lost this long
		o.up()
	}
	e := records(jsonRecords(t, buf.String()), unreachable)[0]
	if n, _ := e["brief_reconnects"].(float64); n < 1 {
		t.Fatalf("the Error: %v; want brief_reconnects counting the moments it was back", e)
	}
	// Up for longer than after, the outage is over: the next loss starts a
	// new one (its own delay), not a continuation.
	// (Not waiting for tell to clear since: after the Error its next look
	// is a minute away, which this test spent in each of make test's two
	// consumer passes. down judges by upAt itself: with its rule for a
	// brief return taken out, this fails.)
	o.mu.Lock()
	gen, upAt := o.gen, o.upAt
	o.mu.Unlock()
	time.Sleep(time.Until(upAt.Add(o.after + 10*time.Millisecond))) // up for longer than after: the scenario, not a wait for an event
	o.down(log)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gen != gen+1 || o.brief != 0 {
		t.Fatalf("a loss after the outage ended: gen %d (was %d), brief %d; want a new outage", o.gen, gen, o.brief)
	}
}

// A connection that does not reconnect (Check's: no delay set) has no
// watch: a loss there logged "jetsink keeps reconnecting" at once, since
// its delay was 0 (1 run in 5 of a review's check against a server shut
// down).
func TestNATSOutageWatchesNothingWithoutADelay(t *testing.T) {
	log, buf := jsonLog(t)
	o := &natsOutage{}
	o.down(log)
	o.mu.Lock()
	timer := o.timer
	o.mu.Unlock()
	o.stop()
	if timer != nil || buf.String() != "" {
		t.Fatalf("a watch without a delay started (timer %v), logged:\n%s", timer != nil, buf.String())
	}
}

// The Error counts the time the connection was lost, not the time since
// the outage began: a blip, then a loss after the connection was up
// longer than it had been lost, starts a new outage, whose Error comes
// once it has been lost for the watch's delay; drops of a few
// milliseconds now and then are no outage at all. Before, a blip and a
// restart 20 s later logged the Error 10 s into the restart, with
// unreachable_for 30 s, and brief drops every 20 s kept an outage open
// for ever.
func TestNATSOutageCountsTheTimeLost(t *testing.T) {
	const after = 200 * time.Millisecond
	log, buf := jsonLog(t)
	o := &natsOutage{after: after}
	defer o.stop()
	// Brief drops, up most of the time: no Error.
	end := time.Now().Add(5 * after)
	for time.Now().Before(end) {
		o.down(log)
		time.Sleep(5 * time.Millisecond) // lost this long
		o.up()
		time.Sleep(after / 3) // up this long
	}
	if strings.Contains(buf.String(), "NATS unreachable") {
		t.Fatalf("an Error for drops of 5 ms every %v:\n%s", after/3, buf.String())
	}
	// A blip, then a loss after more time up than lost: a new outage.
	o.mu.Lock()
	gen := o.gen
	o.mu.Unlock()
	o.down(log)
	o.up()
	time.Sleep(after / 2) // up this long
	lostAt := time.Now()
	o.down(log)
	o.mu.Lock()
	newOutage := o.gen == gen+2
	o.mu.Unlock()
	if !newOutage {
		t.Fatal("a loss after the connection was up longer than lost went on with the blip's outage")
	}
	waitFor(t, context.Background(), "the Error", func() bool { return strings.Contains(buf.String(), "NATS unreachable") })
	if took := time.Since(lostAt); took < after {
		t.Fatalf("the Error came %v into the loss, before the watch's delay %v", took, after)
	}
	e := records(jsonRecords(t, buf.String()), "NATS unreachable")[0]
	if lost, _ := e["unreachable_for"].(float64); time.Duration(lost) < after {
		t.Fatalf("the Error: %v; want unreachable_for of the watch's delay %v at least", e, after)
	}
}
