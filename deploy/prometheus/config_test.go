package prometheus

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"gopkg.in/yaml.v3"
)

// prometheus.yml is a configuration Prometheus loads; it scrapes the
// jetsink service of docker-compose.yml on its admin port, under the job
// name JetsinkDown reads; and docker-compose.yml mounts this file and
// alerts.yml where Prometheus looks for them.
func TestComposePrometheus(t *testing.T) {
	cfg, err := config.LoadFile("prometheus.yml", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(cfg.ScrapeConfigs) != 1 {
		t.Fatalf("%d scrape configs, want jetsink's", len(cfg.ScrapeConfigs))
	}
	sc := cfg.ScrapeConfigs[0]
	var down string
	for _, r := range loadRules(t) {
		if r.Alert == "JetsinkDown" {
			down = r.Expr
		}
	}
	if !strings.Contains(down, `job="`+sc.JobName+`"`) {
		t.Errorf("JetsinkDown reads %q, not the scrape job %q", down, sc.JobName)
	}

	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Volumes     []string          `yaml:"volumes"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	listen := compose.Services["jetsink"].Environment["JETSINK_TELEMETRY_LISTEN"]
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("the jetsink service's JETSINK_TELEMETRY_LISTEN %q: %v", listen, err)
	}
	var targets []string
	for _, sd := range sc.ServiceDiscoveryConfigs {
		static, ok := sd.(discovery.StaticConfig)
		if !ok {
			t.Fatalf("scrape config discovers with %T, want static targets", sd)
		}
		for _, g := range static {
			for _, tg := range g.Targets {
				targets = append(targets, string(tg[model.AddressLabel]))
			}
		}
	}
	if !slices.Equal(targets, []string{"jetsink:" + port}) {
		t.Errorf("scrapes %v, want the jetsink service on its admin port (JETSINK_TELEMETRY_LISTEN %q)", targets, listen)
	}
	prom, ok := compose.Services["prometheus"]
	if !ok {
		t.Fatal("docker-compose.yml has no prometheus service")
	}
	// The release whose packages test the rules here: module v0.307.3 is
	// Prometheus v3.7.3.
	if want := "prom/prometheus:" + releaseOf(t, "github.com/prometheus/prometheus"); prom.Image != want {
		t.Errorf("the prometheus service runs %s, want %s (the release the tests use)", prom.Image, want)
	}
	mounts := map[string]string{} // in the container -> in the repository
	for _, v := range prom.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			t.Fatalf("volume %q is not a bind mount", v)
		}
		mounts[parts[1]] = filepath.Join("../..", parts[0])
	}
	want := map[string]string{"/etc/prometheus/prometheus.yml": "prometheus.yml"} // in the container -> here
	for _, f := range cfg.RuleFiles {
		want[f] = path.Base(f)
	}
	for in, here := range want {
		src, ok := mounts[in]
		if !ok {
			t.Errorf("nothing mounted at %s, which Prometheus reads", in)
			continue
		}
		a, err1 := filepath.Abs(src)
		b, err2 := filepath.Abs(here)
		if err1 != nil || err2 != nil || a != b {
			t.Errorf("%s is mounted from %s, not from deploy/prometheus/%s", in, src, here)
		}
		if _, err := os.Stat(src); err != nil {
			t.Errorf("%s is mounted from %s: %v", in, src, err)
		}
	}
	if !slices.ContainsFunc(cfg.RuleFiles, func(f string) bool { return path.Base(f) == "alerts.yml" }) {
		t.Errorf("rule_files %v does not load alerts.yml", cfg.RuleFiles)
	}
}

// releaseOf is the Prometheus release of module mod as go.mod requires
// it: module v0.MMm.p is release v3.m.p (MM = 30 + major).
func releaseOf(t *testing.T, mod string) string {
	t.Helper()
	raw, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + ` (v\S+)`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("go.mod does not require %s", mod)
	}
	var minor, patch int
	if _, err := fmt.Sscanf(string(m[1]), "v0.%d.%d", &minor, &patch); err != nil || minor < 300 {
		t.Fatalf("%s %s: not a v0.3xx.y version", mod, m[1])
	}
	return fmt.Sprintf("v%d.%d.%d", minor/100, minor%100, patch)
}
