package config

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The jetsink service of docker-compose.yml (which no test here can run)
// sets only variables that the config takes, in forms it accepts: an
// unknown JETSINK_ variable would stop it at start, and restart it for
// ever.
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
	var env []string
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	cfg, err := Parse(nil, env, nil)
	if err != nil {
		t.Fatalf("the jetsink service's environment does not load: %v", err)
	}
	if cfg.Telemetry.Listen != vars["JETSINK_TELEMETRY_LISTEN"] || !strings.HasPrefix(cfg.Postgres.URL, "postgres://") || cfg.NATS.URL != vars["JETSINK_NATS_URL"] {
		t.Errorf("loaded listen %q, postgres %q, nats %q from %v", cfg.Telemetry.Listen, cfg.Postgres.URL, cfg.NATS.URL, vars)
	}
}
