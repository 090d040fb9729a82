package prometheus

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	plabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// scenario is a stretch of jetsink's metrics (promqltest's load syntax, one
// sample a minute from 0) and whether the alert's expression holds at the
// minute at.
type scenario struct {
	name   string
	series string
	at     time.Duration
	fires  bool
}

const labels = `{job="jetsink",instance="a"}`

// scenarios: each alert, where it must fire and where it must not.
var scenarios = map[string][]scenario{
	"JetsinkDown": {
		{"not scraped", `up` + labels + ` 1 1 0 0 0 0 0 0 0 0`, 9 * time.Minute, true},
		{"scraped", `up` + labels + ` 1x10`, 9 * time.Minute, false},
	},
	"JetsinkAbsent": {
		{"no target of the job", `up{job="other",instance="b"} 1x10`, 9 * time.Minute, true},
		{"the target vanished", `up` + labels + ` 1x3 stale`, 9 * time.Minute, true},
		{"a target, down", `up` + labels + ` 0x10`, 9 * time.Minute, false},
	},
	"JetsinkRestarting": {
		{"three restarts", `jetsink_start_time_seconds` + labels + ` 100 100 400 400 700 700 1000x5`, 10 * time.Minute, true},
		{"two restarts", `jetsink_start_time_seconds` + labels + ` 100 100 400 400 700x5`, 9 * time.Minute, false},
		{"three restarts, another job's name", `jetsink_start_time_seconds{job="sink",instance="a"} 100 100 400 400 700 700 1000x5`, 10 * time.Minute, true},
		{"three restarts, long ago", `jetsink_start_time_seconds` + labels + ` 100 100 400 400 700 700 1000x40`, 40 * time.Minute, false},
	},
	"JetsinkNotReady": {
		{"nats failing", `
			jetsink_ready{job="jetsink",instance="a",check="nats"} 1 1 0x10
			jetsink_ready{job="jetsink",instance="a",check="postgres"} 1x12`, 9 * time.Minute, true},
		{"ready", `
			jetsink_ready{job="jetsink",instance="a",check="nats"} 1x12
			jetsink_ready{job="jetsink",instance="a",check="postgres"} 1x12`, 9 * time.Minute, false},
	},
	"JetsinkNotCommitting": {
		{"backlog, no commit", `
			jetsink_consumer_pending` + labels + ` 100x30
			jetsink_consumer_ack_pending` + labels + ` 0x30
			jetsink_events_committed_total` + labels + ` 500x30`, 20 * time.Minute, true},
		{"only in flight, no commit", `
			jetsink_consumer_pending` + labels + ` 0x30
			jetsink_consumer_ack_pending` + labels + ` 40x30
			jetsink_events_committed_total` + labels + ` 500x30`, 20 * time.Minute, true},
		{"backlog, committing", `
			jetsink_consumer_pending` + labels + ` 100x30
			jetsink_consumer_ack_pending` + labels + ` 10x30
			jetsink_events_committed_total` + labels + ` 0+1000x30`, 20 * time.Minute, false},
		{"idle", `
			jetsink_consumer_pending` + labels + ` 0x30
			jetsink_consumer_ack_pending` + labels + ` 0x30
			jetsink_events_committed_total` + labels + ` 500x30`, 20 * time.Minute, false},
	},
	"JetsinkBatchStuck": {
		{"one attempt for 5 minutes", `jetsink_batch_attempt_age_seconds` + labels + ` 0+60x10`, 5 * time.Minute, true},
		{"short attempts", `jetsink_batch_attempt_age_seconds` + labels + ` 0 0.02 0 0.5 0 0.01 0 0`, 5 * time.Minute, false},
	},
	// The bounds jetsink serves (telemetry/latency.go), from 5 s up.
	"JetsinkBehind": {
		{"3% over a minute", `
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="5"} 0+90x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="10"} 0+95x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="30"} 0+96x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="60"} 0+97x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="+Inf"} 0+100x30
			jetsink_event_latency_seconds_count{job="jetsink",instance="a"} 0+100x30`, 20 * time.Minute, true},
		{"slow, none over a minute", `
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="5"} 0+10x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="10"} 0+20x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="30"} 0+50x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="60"} 0+100x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="+Inf"} 0+100x30
			jetsink_event_latency_seconds_count{job="jetsink",instance="a"} 0+100x30`, 20 * time.Minute, false},
		{"idle", `
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="60"} 97x30
			jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="+Inf"} 100x30
			jetsink_event_latency_seconds_count{job="jetsink",instance="a"} 100x30`, 20 * time.Minute, false},
	},
	"JetsinkNATSSilent": {
		{"no answer for 5 minutes", `jetsink_consumer_lag_age_seconds` + labels + ` 0+60x10`, 5 * time.Minute, true},
		{"answering", `jetsink_consumer_lag_age_seconds` + labels + ` 1x10`, 5 * time.Minute, false},
	},
	"JetsinkDeadLetters": {
		{"more dead letters", `jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="decode",code="invalid_json"} 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 5 5 5 5 5 5`, 17 * time.Minute, true},
		{"a code's first dead letter", `jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="sink",code="constraint"} 0x15 1x10`, 16 * time.Minute, true},
		{"none for a while", `
			jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="decode",code="invalid_json"} 3x30
			jetsink_start_time_seconds` + labels + ` 0x30`, 25 * time.Minute, false},
		{"before the first scrape", `
			jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="decode",code="invalid_json"} 3x5
			jetsink_start_time_seconds` + labels + ` 0x5`, 3 * time.Minute, true},
		{"none, with a failed scrape", `jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="decode",code="invalid_json"} 3x10 stale 3x20`, 21 * time.Minute, false},
		{"the first after a restart", `jetsink_events_dead_lettered_total{job="jetsink",instance="a",stage="decode",code="invalid_json"} 3x10 0x5 1x10`, 17 * time.Minute, true},
	},
	"JetsinkEventsDeletedUnread": {
		{"deleted while running", `
			jetsink_events_deleted_unread_total` + labels + ` 0x15 40x10
			jetsink_start_time_seconds` + labels + ` 0x25`, 18 * time.Minute, true},
		{"counted at start, before the first scrape", `
			jetsink_events_deleted_unread_total` + labels + ` 15x5
			jetsink_start_time_seconds` + labels + ` 0x5`, 3 * time.Minute, true},
		{"none for a while", `
			jetsink_events_deleted_unread_total` + labels + ` 15x30
			jetsink_start_time_seconds` + labels + ` 0x30`, 25 * time.Minute, false},
		{"none", `
			jetsink_events_deleted_unread_total` + labels + ` 0x10
			jetsink_start_time_seconds` + labels + ` 0x10`, 5 * time.Minute, false},
	},
	"JetsinkDeadLetterFailing": {
		{"failing for 5 minutes", `jetsink_dead_letter_failures_total` + labels + ` 0+1x15`, 12 * time.Minute, true},
		{"one failure that healed", `jetsink_dead_letter_failures_total` + labels + ` 0 0 0 1x12`, 8 * time.Minute, false},
		{"none", `jetsink_dead_letter_failures_total` + labels + ` 0x10`, 5 * time.Minute, false},
	},
	"JetsinkRedelivering": {
		{"10% redelivered", `
			jetsink_events_received_total` + labels + ` 0+1000x30
			jetsink_events_redelivered_total` + labels + ` 0+100x30`, 20 * time.Minute, true},
		{"1% redelivered", `
			jetsink_events_received_total` + labels + ` 0+1000x30
			jetsink_events_redelivered_total` + labels + ` 0+10x30`, 20 * time.Minute, false},
		{"idle", `
			jetsink_events_received_total` + labels + ` 1000x30
			jetsink_events_redelivered_total` + labels + ` 10x30`, 20 * time.Minute, false},
		{"a quiet stream, one crash", `
			jetsink_events_received_total` + labels + ` 0+10x30
			jetsink_events_redelivered_total` + labels + ` 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 20 20 20 20 20 20 20 20`, 20 * time.Minute, false},
	},
	"JetsinkAcksFailing": {
		{"acks failed", `jetsink_ack_failures_total` + labels + ` 0 0 2 2 2 2`, 5 * time.Minute, true},
		{"none", `jetsink_ack_failures_total` + labels + ` 0x10`, 5 * time.Minute, false},
	},
	"JetsinkRowsMiscounted": {
		{"a miscounted COPY", `
			jetsink_copy_miscounts_total` + labels + ` 0 0 1 1 1 1
			jetsink_ack_stale_total` + labels + ` 0x5`, 5 * time.Minute, true},
		{"a stale ack", `
			jetsink_copy_miscounts_total` + labels + ` 0x5
			jetsink_ack_stale_total` + labels + ` 0 0 0 7 7 7`, 5 * time.Minute, true},
		{"none", `
			jetsink_copy_miscounts_total` + labels + ` 0x5
			jetsink_ack_stale_total` + labels + ` 0x5`, 5 * time.Minute, false},
	},
	"JetsinkPostgresConnectionsDead": {
		{"one given up", `jetsink_postgres_dead_connections_total` + labels + ` 0 0 1 1 1`, 4 * time.Minute, true},
		{"none", `jetsink_postgres_dead_connections_total` + labels + ` 0x5`, 4 * time.Minute, false},
	},
	"JetsinkBatchesTimingOut": {
		{"three attempts cut", `jetsink_batch_timeout_splits_total` + labels + ` 0 0 3 3 3`, 4 * time.Minute, true},
		{"none", `jetsink_batch_timeout_splits_total` + labels + ` 0x5`, 4 * time.Minute, false},
	},
	"JetsinkSpansLost": {
		{"queue full", `jetsink_trace_spans_lost_total{job="jetsink",instance="a",reason="queue_full"} 0 0 30 30 30`, 4 * time.Minute, true},
		{"none", `jetsink_trace_spans_lost_total{job="jetsink",instance="a",reason="queue_full"} 0x5`, 4 * time.Minute, false},
	},
}

// asStored is how each scenario's series are given to Prometheus: as
// jetsink exposes them, which is how Prometheus 2 stored them, and as
// Prometheus 3 (the one docker-compose.yml runs) stores them once scraped.
var asStored = []struct {
	name    string
	scraped bool
}{{"as exposed", false}, {"as scraped by Prometheus 3", true}}

// bucketBound is a classic histogram's bucket bound in a series.
var bucketBound = regexp.MustCompile(`\ble="([^"]*)"`)

// load is promqltest's load command for series, one sample a minute; with
// scraped, each bucket bound as Prometheus stores it after a scrape
// (storedBound).
func load(t *testing.T, series string, scraped bool) string {
	t.Helper()
	if scraped {
		series = bucketBound.ReplaceAllStringFunc(series, func(m string) string {
			return `le="` + storedBound(t, bucketBound.FindStringSubmatch(m)[1]) + `"`
		})
	}
	cmd := "load 1m\n"
	for _, l := range strings.Split(series, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			cmd += "  " + l + "\n"
		}
	}
	return cmd
}

// storedBound is the bucket bound le as Prometheus's own scrape parser
// stores it, read from a one-bucket text exposition: Prometheus 3 writes
// whole numbers with a ".0" (le="60" is stored le="60.0"), so a rule that
// matches le="60" finds nothing.
func storedBound(t *testing.T, le string) string {
	t.Helper()
	text := "# TYPE m histogram\nm_bucket{le=\"" + le + "\"} 1\n"
	p := textparse.NewPromParser([]byte(text), plabels.NewSymbolTable(), false)
	for {
		e, err := p.Next()
		if err != nil {
			t.Fatalf("parse %q: %v", text, err)
		}
		if e == textparse.EntrySeries {
			var ls plabels.Labels
			p.Labels(&ls)
			return ls.Get("le")
		}
	}
}

func loadRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(raw, false, model.LegacyValidation)
	if len(errs) > 0 {
		t.Fatalf("alerts.yml: %v", errs)
	}
	var rules []rulefmt.Rule
	for _, g := range groups.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("alerts.yml holds no rules")
	}
	return rules
}

// The file is what Prometheus loads (rulefmt also parses each expression
// and template), and every alert says how bad it is and what happened.
func TestAlertsAreValid(t *testing.T) {
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("rule %q is not an alert", r.Record)
			continue
		}
		if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
			t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("%s: no summary", r.Alert)
		}
	}
}

// Each alert's expression holds where it should and only there, evaluated
// by Prometheus's own engine on the series of each scenario.
func TestAlertsFireInTheirScenarios(t *testing.T) {
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		seen[r.Alert] = true
		cases := scenarios[r.Alert]
		if len(cases) == 0 {
			t.Errorf("%s: no scenario tests it", r.Alert)
		}
		var fires, quiet bool
		for _, sc := range cases {
			fires, quiet = fires || sc.fires, quiet || !sc.fires
			for _, as := range asStored {
				t.Run(r.Alert+"/"+sc.name+"/"+as.name, func(t *testing.T) {
					st := promqltest.LoadedStorage(t, load(t, sc.series, as.scraped))
					defer st.Close()
					q, err := engine.NewInstantQuery(context.Background(), st, nil, r.Expr, time.Unix(0, 0).Add(sc.at))
					if err != nil {
						t.Fatal(err)
					}
					defer q.Close()
					res := q.Exec(context.Background())
					if res.Err != nil {
						t.Fatal(res.Err)
					}
					v, err := res.Vector()
					if err != nil {
						t.Fatal(err)
					}
					if got := len(v) > 0; got != sc.fires {
						t.Fatalf("fires = %v, want %v; the expression gives %v", got, sc.fires, v)
					}
				})
			}
		}
		if len(cases) > 0 && !(fires && quiet) {
			t.Errorf("%s: its scenarios should show it both firing and quiet", r.Alert)
		}
	}
	for name := range scenarios {
		if !seen[name] {
			t.Errorf("scenario for %s, which alerts.yml does not hold", name)
		}
	}
}
