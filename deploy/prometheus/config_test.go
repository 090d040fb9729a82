package prometheus

import (
	"log/slog"
	"os"
	"path"
	"path/filepath"
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
	_, port, _ := strings.Cut(listen, ":")
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
	mounts := map[string]string{} // in the container -> in the repository
	for _, v := range prom.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			t.Fatalf("volume %q is not a bind mount", v)
		}
		mounts[parts[1]] = filepath.Join("../..", parts[0])
	}
	want := append([]string{"/etc/prometheus/prometheus.yml"}, cfg.RuleFiles...)
	for _, in := range want {
		src, ok := mounts[in]
		if !ok {
			t.Errorf("nothing mounted at %s, which Prometheus reads", in)
			continue
		}
		if _, err := os.Stat(src); err != nil {
			t.Errorf("%s is mounted from %s: %v", in, src, err)
		}
		if base := path.Base(in); filepath.Base(src) != base {
			t.Errorf("%s is mounted from %s, another file", in, src)
		}
	}
	if !slices.ContainsFunc(cfg.RuleFiles, func(f string) bool { return path.Base(f) == "alerts.yml" }) {
		t.Errorf("rule_files %v does not load alerts.yml", cfg.RuleFiles)
	}
}
