package prometheus

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/config"
	plabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// says is what the summary of an alert firing in a scenario must say, for
// summaries that render the expression's value: the value, as a reader
// expects it.
var says = map[string]string{
	"JetsinkNotCommitting/backlog, no commit":        "with 100 events waiting",
	"JetsinkNotCommitting/only in flight, no commit": "with 40 events waiting",
	"JetsinkBatchStuck/one attempt for 5 minutes":    "has waited 5m 0s",
	"JetsinkBehind/3% over a minute":                 "a: 3% of the events committed",
	"JetsinkNATSSilent/no answer for 5 minutes":      "for 5m 0s",
	"JetsinkAcksFailing/acks failed":                 "about 2 acks",
	"JetsinkPostgresConnectionsDead/one given up":    "about 1 silent",
}

// Each alert runs as Prometheus runs it: its rule evaluated at
// prometheus.yml's evaluation_interval from the scenario's start to its
// minute, with its for:, so that an alert whose expression holds too
// briefly stays pending. Where it fires, it must have been pending for
// exactly its for: first, and its labels and annotations must render: no
// template error, nothing left unexpanded, the instance named.
func TestAlertsWaitTheirForAndRender(t *testing.T) {
	cfg, err := config.LoadFile("prometheus.yml", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	step := time.Duration(cfg.GlobalConfig.EvaluationInterval)
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	for _, r := range loadRules(t) {
		expr, err := parser.ParseExpr(r.Expr)
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		hold := time.Duration(r.For)
		for _, sc := range scenarios[r.Alert] {
			t.Run(r.Alert+"/"+sc.name, func(t *testing.T) {
				st := promqltest.LoadedStorage(t, load(sc.series))
				defer st.Close()
				rule := rules.NewAlertingRule(r.Alert, expr, hold, time.Duration(r.KeepFiringFor),
					plabels.FromMap(r.Labels), plabels.FromMap(r.Annotations), plabels.EmptyLabels(), "", true, slog.New(slog.DiscardHandler))
				query := rules.EngineQueryFunc(engine, st)
				start := time.Unix(0, 0)
				for ts := start; !ts.After(start.Add(sc.at)); ts = ts.Add(step) {
					if _, err := rule.Eval(context.Background(), 0, ts, query, nil, 0); err != nil {
						t.Fatalf("at %v: %v", ts.Sub(start), err)
					}
				}
				var firing []*rules.Alert
				for _, a := range rule.ActiveAlerts() {
					if a.State == rules.StateFiring {
						firing = append(firing, a)
					}
				}
				if got := len(firing) > 0; got != sc.fires {
					t.Fatalf("firing at %v = %v, want %v (for: %v; active: %d)", sc.at, got, sc.fires, hold, len(rule.ActiveAlerts()))
				}
				for _, a := range firing {
					if waited := a.FiredAt.Sub(a.ActiveAt); waited < hold || waited >= hold+step {
						t.Errorf("fired %v after it became pending, want its for: %v", waited, hold)
					}
					for _, ls := range []plabels.Labels{a.Labels, a.Annotations} {
						ls.Range(func(l plabels.Label) {
							if strings.Contains(l.Value, "error expanding template") || strings.Contains(l.Value, "{{") {
								t.Errorf("%s = %q", l.Name, l.Value)
							}
						})
					}
					if s := a.Annotations.Get("summary"); !strings.Contains(s, "jetsink a") {
						t.Errorf("summary %q does not name the instance", s)
					}
					if want, ok := says[r.Alert+"/"+sc.name]; ok && !strings.Contains(a.Annotations.Get("summary"), want) {
						t.Errorf("summary %q, want it to say %q", a.Annotations.Get("summary"), want)
					} else if !ok && strings.Contains(r.Annotations["summary"], "$value") {
						t.Errorf("summary %q renders $value, and says has no entry for this scenario", a.Annotations.Get("summary"))
					}
				}
			})
		}
	}
}
