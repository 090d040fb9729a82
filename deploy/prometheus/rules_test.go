package prometheus

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/config"
	plabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"gopkg.in/yaml.v3"
)

// says is what the summary of an alert firing in a scenario must say, for
// summaries that render the expression's value: the value, as a reader
// expects it.
var says = map[string]string{
	"JetsinkNotCommitting/backlog, no commit":              "with 100 events waiting",
	"JetsinkNotCommitting/only in flight, no commit":       "with 40 events waiting",
	"JetsinkBatchStuck/one attempt for 5 minutes":          "has waited 5m 0s",
	"JetsinkBehind/3% over a minute":                       "a: 3% of the events committed",
	"JetsinkNATSSilent/no answer for 5 minutes":            "for 5m 0s",
	"JetsinkAcksFailing/acks failed":                       "about 2 acks",
	"JetsinkPostgresConnectionsDead/one given up":          "about 1 silent",
	"JetsinkBatchesTimingOut/three attempts cut":           "about 3 commit attempts",
	"JetsinkRestarting/three restarts":                     "restarted 3 times",
	"JetsinkRestarting/three restarts, another job's name": "restarted 3 times",
	"JetsinkAbsent/no target of the job":                   "no target of job jetsink)",
}

// pending: for each alert with a for:, a scenario whose expression holds
// at its minute, but for less than the for:, so the alert must be pending,
// not firing.
var pending = map[string]scenario{
	"JetsinkDown":     {"down 3 minutes", `up` + labels + ` 1x5 0 0 0 0`, 9 * time.Minute, false},
	"JetsinkAbsent":   {"gone 3 minutes", `up` + labels + ` 1x5 stale`, 9 * time.Minute, false},
	"JetsinkNotReady": {"nats failing 3 minutes", `jetsink_ready{job="jetsink",instance="a",check="nats"} 1x5 0 0 0 0`, 9 * time.Minute, false},
	"JetsinkNotCommitting": {"backlog, no commit for 8 minutes", `
		jetsink_consumer_pending` + labels + ` 100x30
		jetsink_consumer_ack_pending` + labels + ` 0x30
		jetsink_events_committed_total` + labels + ` 0+1000x12 12000x18`, 20 * time.Minute, false},
	"JetsinkBatchStuck": {"an attempt past a minute, 30 s ago", `jetsink_batch_attempt_age_seconds` + labels + ` 0x4 60 120`, 6*time.Minute + 30*time.Second, false},
	"JetsinkBehind": {"3% late for 5 minutes", `
		jetsink_event_latency_seconds_bucket{job="jetsink",instance="a",le="60"} 0+100x15 1597+97x15
		jetsink_event_latency_seconds_count{job="jetsink",instance="a"} 0+100x30`, 20 * time.Minute, false},
	"JetsinkDeadLetterFailing": {"failing for 3 minutes", `jetsink_dead_letter_failures_total` + labels + ` 0x5 0+1x10`, 8 * time.Minute, false},
	"JetsinkNATSSilent":        {"no answer for 2 minutes", `jetsink_consumer_lag_age_seconds` + labels + ` 1x5 60 120`, 8 * time.Minute, false},
	"JetsinkRedelivering": {"redelivering for 5 minutes", `
		jetsink_events_received_total` + labels + ` 0+1000x30
		jetsink_events_redelivered_total` + labels + ` 0x14 0+300x15`, 20 * time.Minute, false},
}

// templateLabel finds the labels a template reads: {{ $labels.stage }}.
var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// Each alert runs as Prometheus runs it: its rule evaluated at
// prometheus.yml's evaluation_interval from the scenario's start to its
// minute, with its for:. It fires where its scenario says the expression
// holds (each lasts longer than the for:), and stays pending where the
// expression has held for less (pending). A firing alert's annotations
// must render: no template error, the instance named, every label they
// read present, and the value said as a reader expects it (says).
func TestAlertsWaitTheirForAndRender(t *testing.T) {
	cfg, err := config.LoadFile("prometheus.yml", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	step := time.Duration(cfg.GlobalConfig.EvaluationInterval)
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	// run evaluates r through sc and returns its alerts at sc.at.
	run := func(t *testing.T, r rulefmt.Rule, sc scenario, scraped bool) []*rules.Alert {
		expr, err := parser.ParseExpr(r.Expr)
		if err != nil {
			t.Fatal(err)
		}
		st := promqltest.LoadedStorage(t, load(t, sc.series, scraped))
		defer st.Close()
		rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
			plabels.FromMap(r.Labels), plabels.FromMap(r.Annotations), plabels.EmptyLabels(), "", true, slog.New(slog.DiscardHandler))
		query := rules.EngineQueryFunc(engine, st)
		start := time.Unix(0, 0)
		for ts := start; !ts.After(start.Add(sc.at)); ts = ts.Add(step) {
			if _, err := rule.Eval(context.Background(), 0, ts, query, nil, 0); err != nil {
				t.Fatalf("at %v: %v", ts.Sub(start), err)
			}
		}
		return rule.ActiveAlerts()
	}
	inState := func(alerts []*rules.Alert, s rules.AlertState) (n int) {
		for _, a := range alerts {
			if a.State == s {
				n++
			}
		}
		return n
	}
	used := map[string]bool{}
	for _, r := range loadRules(t) {
		if p, ok := pending[r.Alert]; ok {
			for _, as := range asStored {
				t.Run(r.Alert+"/"+p.name+"/"+as.name, func(t *testing.T) {
					alerts := run(t, r, p, as.scraped)
					if inState(alerts, rules.StatePending) == 0 || inState(alerts, rules.StateFiring) > 0 {
						t.Fatalf("at %v: %d pending, %d firing; want it pending, its for: (%v) not yet over",
							p.at, inState(alerts, rules.StatePending), inState(alerts, rules.StateFiring), time.Duration(r.For))
					}
				})
			}
		} else if r.For > 0 {
			t.Errorf("%s has a for: and no pending scenario", r.Alert)
		}
		for _, sc := range scenarios[r.Alert] {
			for _, as := range asStored {
				t.Run(r.Alert+"/"+sc.name+"/"+as.name, func(t *testing.T) {
					alerts := run(t, r, sc, as.scraped)
					firing := inState(alerts, rules.StateFiring)
					if got := firing > 0; got != sc.fires {
						t.Fatalf("firing at %v = %v, want %v (for: %v; active: %d)", sc.at, got, sc.fires, time.Duration(r.For), len(alerts))
					}
					for _, a := range alerts {
						if a.State != rules.StateFiring {
							continue
						}
						summary := a.Annotations.Get("summary")
						a.Annotations.Range(func(l plabels.Label) {
							if strings.Contains(l.Value, "error expanding template") {
								t.Errorf("%s = %q", l.Name, l.Value)
							}
						})
						for _, text := range r.Annotations {
							for _, m := range templateLabel.FindAllStringSubmatch(text, -1) {
								if a.Labels.Get(m[1]) == "" {
									t.Errorf("its annotations read $labels.%s, which the alert does not have (labels %v)", m[1], a.Labels)
								}
							}
						}
						// (JetsinkAbsent has no instance to name: there is none.)
						if !strings.Contains(summary, "jetsink a") && r.Alert != "JetsinkAbsent" {
							t.Errorf("summary %q does not name the instance", summary)
						}
						key := r.Alert + "/" + sc.name
						want, ok := says[key]
						used[key] = true
						switch {
						case ok && !strings.Contains(summary, want):
							t.Errorf("summary %q, want it to say %q", summary, want)
						case !ok && strings.Contains(r.Annotations["summary"], "$value"):
							t.Errorf("summary %q renders $value, and says has no entry for this scenario", summary)
						}
					}
				})
			}
		}
	}
	for key := range says {
		if !used[key] {
			t.Errorf("says[%q]: no alert fired in that scenario", key)
		}
	}
}

// jobNameComment is what the README tells users to look for in alerts.yml
// to set their scrape job's name.
const jobNameComment = "Put the job name of your scrape config here"

// Every rule that matches on the job says, in its comment, to put the
// scrape job's name there (a user who renames the job edits the rules the
// README points at, and a rule it does not would never fire), and names
// prometheus.yml's job. A rule needs the job only where nothing else tells
// jetsink's series apart: up; jetsink's own metrics do.
func TestRulesNamingTheJobSaySo(t *testing.T) {
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []yaml.Node `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFile("prometheus.yml", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	job := cfg.ScrapeConfigs[0].JobName
	naming := 0
	for _, g := range file.Groups {
		for _, n := range g.Rules {
			var r struct {
				Alert, Expr string
			}
			if err := n.Decode(&r); err != nil {
				t.Fatal(err)
			}
			comment := n.HeadComment
			if len(n.Content) > 0 {
				comment += n.Content[0].HeadComment
			}
			expr, err := parser.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			var values []string
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				if vs, ok := node.(*parser.VectorSelector); ok {
					for _, m := range vs.LabelMatchers {
						if m.Name == "job" {
							values = append(values, m.Value)
						}
					}
				}
				return nil
			})
			if len(values) == 0 {
				continue
			}
			naming++
			if !strings.Contains(comment, jobNameComment) {
				t.Errorf("%s matches on the job, and its comment does not say %q:\n%s", r.Alert, jobNameComment, comment)
			}
			for _, v := range values {
				if v != job {
					t.Errorf("%s matches job %q, and prometheus.yml's scrape job is %q", r.Alert, v, job)
				}
			}
		}
	}
	if naming == 0 {
		t.Error("no rule matches on the job: JetsinkDown and JetsinkAbsent read up, which every target has")
	}
}
