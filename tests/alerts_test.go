package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/sink"
)

// Every metric that deploy/prometheus/alerts.yml names is one jetsink
// serves, and every histogram bound it reads too: a metric renamed or
// dropped, or a bound that is not one of jetsink's, would leave an alert
// that can never fire, which its own tests (deploy/prometheus, a module of its own, on
// made-up series) cannot see. The run has a dead letter and tracing on, so
// that the series served only then are there too.
func TestAlertRulesNameServedMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, n := range regexp.MustCompile(`\bjetsink_[a-z0-9_]+`).FindAllString(string(raw), -1) {
		if !slices.Contains(named, n) {
			named = append(named, n)
		}
	}
	if len(named) < 10 {
		t.Fatalf("alerts.yml names %d metrics: %v", len(named), named)
	}
	// The histogram buckets the rules read (le="60", or le=~"60(\\.0)?" for
	// Prometheus 3, which stores it as "60.0"): a bound jetsink does not
	// serve matches no series, and the rule never fires.
	bounds := map[string]*regexp.Regexp{} // as the rule writes it -> a served series of it
	for _, m := range regexp.MustCompile(`(jetsink_[a-z0-9_]+_bucket)\{[^}]*le(=~?)"((?:[^"\\]|\\.)+)"`).FindAllStringSubmatch(string(raw), -1) {
		value := regexp.QuoteMeta(m[3])
		if m[2] == "=~" {
			// A PromQL string's \\ is one \; its regular expression is
			// anchored at both ends.
			value = "(?:" + strings.ReplaceAll(m[3], `\\`, `\`) + ")"
		}
		bounds[m[1]+"{le"+m[2]+`"`+m[3]+`"}`] = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `\{[^}]*\ble="` + value + `"[,}]`)
	}
	if len(bounds) == 0 {
		t.Fatal("alerts.yml reads no histogram bucket; the test expects JetsinkBehind's")
	}

	// An OTLP/HTTP collector that takes every export.
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	e := newEnv(t)
	cfg := e.config(sink.AtLeastOnce)
	cfg.Telemetry.OTLPEndpoint = collector.URL
	cfg.Telemetry.SampleRatio = 1
	e.createStreams(ctx)
	const n = 200
	e.publish(ctx, 0, n, 10)
	if _, err := e.js.Publish(ctx, e.prefix+".bad", []byte("not JSON")); err != nil {
		t.Fatal(err)
	}
	r := e.start(ctx, cfg)
	e.waitDrained(ctx, n, r)
	waitFor(t, ctx, "every metric alerts.yml names on /metrics", func() (bool, string) {
		code, body := adminGet(t, ctx, r, "/metrics")
		served := map[string]string{} // family -> type
		for _, line := range strings.Split(body, "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
				served[f[2]] = f[3]
			}
		}
		var missing []string
		for _, name := range named {
			if isServed(served, name) {
				continue
			}
			missing = append(missing, name)
		}
		for bound, served := range bounds {
			if !served.MatchString(body) {
				missing = append(missing, bound)
			}
		}
		return code == 200 && len(missing) == 0, fmt.Sprintf("status %d; not served: %v", code, missing)
	})
	r.drain(t)
}

// isServed reports whether name is a family of served or a histogram's
// series (_bucket, _sum, _count).
func isServed(served map[string]string, name string) bool {
	if _, ok := served[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && served[base] == "histogram" {
			return true
		}
	}
	return false
}
