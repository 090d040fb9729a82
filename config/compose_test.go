package config

import (
	"encoding/json"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/jetsink/jetsink/telemetry"
)

// The jetsink service of docker-compose.yml (which no test here can run)
// sets only variables that the config takes, in forms it accepts, with
// values that pass validation, as "jetsink run" loads them: an unknown
// JETSINK_ variable or a value refused would stop it at start, and restart
// it for ever.
func TestComposeEnvironmentLoads(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	vars := compose.Services["jetsink"].Environment
	if len(vars) == 0 {
		t.Fatal("docker-compose.yml: no environment for the jetsink service")
	}
	load := func(vars map[string]string) (Config, error) {
		var env []string
		for k, v := range vars {
			env = append(env, k+"="+v)
		}
		return Load(Source{Env: env})
	}
	cfg, err := load(vars)
	if err != nil {
		t.Fatalf("the jetsink service's environment does not load: %v", err)
	}
	if cfg.Telemetry.Listen != vars["JETSINK_TELEMETRY_LISTEN"] || !strings.HasPrefix(cfg.Postgres.URL, "postgres://") || cfg.NATS.URL != vars["JETSINK_NATS_URL"] {
		t.Errorf("loaded listen %q, postgres %q, nats %q from %v", cfg.Telemetry.Listen, cfg.Postgres.URL, cfg.NATS.URL, vars)
	}
	// The check itself: a value that parses but that validation refuses
	// fails it.
	bad := maps.Clone(vars)
	bad["JETSINK_MEMORY_LIMIT"] = "8MiB"
	if _, err := load(bad); err == nil {
		t.Error("the environment with JETSINK_MEMORY_LIMIT=8MiB (below the 16MiB validation asks) loads: the check does not validate")
	}
}

// The image's and docker-compose.yml's health checks wait longer than
// /readyz gives a check, so that its answer, which names what failed,
// reaches Docker's health log, and not as long as Docker waits for them.
func TestHealthcheckTimeoutsNest(t *testing.T) {
	nest := func(where, command string, docker time.Duration) {
		t.Helper()
		_, arg, ok := strings.Cut(command, "--timeout ")
		if !ok || len(strings.Fields(arg)) == 0 {
			t.Errorf("%s: %q gives no --timeout", where, command)
			return
		}
		mine, err := time.ParseDuration(strings.Fields(arg)[0])
		if err != nil {
			t.Errorf("%s: %q: %v", where, command, err)
			return
		}
		if mine <= telemetry.CheckTimeout || mine >= docker {
			t.Errorf("%s: healthcheck --timeout %v, want it between /readyz's %v per check and Docker's %v", where, mine, telemetry.CheckTimeout, docker)
		}
	}

	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Healthcheck struct {
				Test    []string `yaml:"test"`
				Timeout string   `yaml:"timeout"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	hc := compose.Services["jetsink"].Healthcheck
	docker, err := time.ParseDuration(hc.Timeout)
	if err != nil {
		t.Fatalf("docker-compose.yml: the jetsink service's healthcheck timeout %q: %v", hc.Timeout, err)
	}
	nest("docker-compose.yml", strings.Join(hc.Test, " "), docker)

	raw, err = os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	_, line, ok := strings.Cut(string(raw), "\nHEALTHCHECK ")
	if !ok {
		t.Fatal("Dockerfile: no HEALTHCHECK")
	}
	line, _, _ = strings.Cut(line, "\n")
	_, opt, ok := strings.Cut(line, " --timeout=")
	if !ok {
		t.Fatalf("Dockerfile: HEALTHCHECK %s sets no --timeout", line)
	}
	if docker, err = time.ParseDuration(strings.Fields(opt)[0]); err != nil {
		t.Fatalf("Dockerfile: HEALTHCHECK --timeout: %v", err)
	}
	_, command, _ := strings.Cut(line, " CMD ")
	var argv []string // the exec form
	if err := json.Unmarshal([]byte(command), &argv); err != nil {
		t.Fatalf("Dockerfile: HEALTHCHECK CMD %s: %v", command, err)
	}
	nest("Dockerfile", strings.Join(argv, " "), docker)
}
