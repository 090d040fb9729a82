package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
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

// A service that another waits for to be healthy (depends_on, condition
// service_healthy) gives its healthcheck a start period of a minute or
// more: nats-server's /healthz fails while JetStream recovers its streams
// and pg_isready while PostgreSQL recovers from a crash, each as long as
// the store is large, and without one, 12 failures at 5 s mark it
// unhealthy and `docker compose up` gives up on the service waiting.
func TestComposeWaitedForServicesHaveAStartPeriod(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			DependsOn map[string]struct {
				Condition string `yaml:"condition"`
			} `yaml:"depends_on"`
			Healthcheck struct {
				StartPeriod string `yaml:"start_period"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	waited := 0
	for name, svc := range compose.Services {
		for dep, c := range svc.DependsOn {
			if c.Condition != "service_healthy" {
				continue
			}
			waited++
			sp := compose.Services[dep].Healthcheck.StartPeriod
			if d, err := time.ParseDuration(sp); err != nil || d < time.Minute {
				t.Errorf("docker-compose.yml: %s waits for %s to be healthy, whose healthcheck start_period is %q; want 1m or more", name, dep, sp)
			}
		}
	}
	if waited == 0 {
		t.Error("docker-compose.yml: no service waits for another to be healthy: the check checks nothing")
	}
}

// pinned are the files that name the versions the images must match.
type pinned struct {
	goMod, dockerfile, compose      string // ../go.mod, ../Dockerfile, ../docker-compose.yml
	jaegerMod, jaegerBuild, tracing string // tools/jaeger's go.mod and build.sh, tests/tracing_test.go
}

// The images of the Dockerfile and docker-compose.yml are those of what
// the tests run: the Go of go.mod's go line builds the image, the nats
// image is the release line of the nats-server the tests embed, and the
// Jaeger image is the release the tracing test runs (tools/jaeger). A
// version raised in one place alone fails here; so does each one changed
// in a copy of the files.
func TestImagesMatchWhatTheTestsRun(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	files := pinned{
		goMod:       read("../go.mod"),
		dockerfile:  read("../Dockerfile"),
		compose:     read("../docker-compose.yml"),
		jaegerMod:   read("../tools/jaeger/go.mod"),
		jaegerBuild: read("../tools/jaeger/build.sh"),
		tracing:     read("../tests/tracing_test.go"),
	}
	for _, p := range pinProblems(files) {
		t.Error(p)
	}

	// The check itself: each version changed alone, in a copy, is caught.
	bump := func(field func(*pinned) *string, re, repl string) func(pinned) pinned {
		return func(f pinned) pinned { // f is a copy
			p := field(&f)
			changed := regexp.MustCompile(re).ReplaceAllString(*p, repl)
			if changed == *p {
				t.Fatalf("the mutation %s -> %s changes nothing", re, repl)
			}
			*p = changed
			return f
		}
	}
	goMod := func(f *pinned) *string { return &f.goMod }
	compose := func(f *pinned) *string { return &f.compose }
	for name, mutate := range map[string]func(pinned) pinned{
		"go.mod's go line":            bump(goMod, `(?m)^go (\d+)\.\d+`, "go ${1}.99"),
		"the Dockerfile's golang tag": bump(func(f *pinned) *string { return &f.dockerfile }, `golang:(\d+)\.\d+`, "golang:${1}.99"),
		"go.mod's nats-server":        bump(goMod, `(nats-server/v2 v\d+)\.\d+`, "${1}.99"),
		"the nats image":              bump(compose, `image: nats:(\d+)\.\d+`, "image: nats:${1}.99"),
		"the jaeger image":            bump(compose, `(jaegertracing/jaeger:\d+)\.\d+`, "${1}.99"),
		"tools/jaeger's go.mod":       bump(func(f *pinned) *string { return &f.jaegerMod }, `(jaegertracing/jaeger v\d+)\.\d+`, "${1}.99"),
		"tools/jaeger/build.sh":       bump(func(f *pinned) *string { return &f.jaegerBuild }, `(?m)^(version=v\d+)\.\d+`, "${1}.99"),
		"tests' jaegerVersion":        bump(func(f *pinned) *string { return &f.tracing }, `(jaegerVersion = "v\d+)\.\d+`, "${1}.99"),
	} {
		if p := pinProblems(mutate(files)); len(p) == 0 {
			t.Errorf("%s changed alone passes the check", name)
		} else {
			t.Logf("%s changed alone: %s", name, strings.Join(p, "; "))
		}
	}
}

// pinProblems says where the images of f do not match the versions the
// tests run, or a version cannot be found.
func pinProblems(f pinned) []string {
	var problems []string
	find := func(where, text, re string) string {
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			problems = append(problems, fmt.Sprintf("%s: no match for %s", where, re))
			return ""
		}
		return m[1]
	}
	var compose struct {
		Services map[string]struct {
			Image string `yaml:"image"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(f.compose), &compose); err != nil {
		return []string{fmt.Sprintf("docker-compose.yml: %v", err)}
	}
	// A tag's major.minor: 1.26 of golang:1.26-bookworm or 1.26.1-bookworm.
	const majorMinor = `(\d+\.\d+)(?:\.\d+)?(?:-\S+)?`

	goLine := find("go.mod", f.goMod, `(?m)^go (\d+\.\d+)(?:\.\d+)?\s*$`)
	golang := find("Dockerfile", f.dockerfile, `(?m)^FROM golang:`+majorMinor+`(?:\s|$)`)
	if goLine != "" && golang != "" && golang != goLine {
		problems = append(problems, fmt.Sprintf("the Dockerfile builds with golang:%s, go.mod says go %s", golang, goLine))
	}

	natsMod := find("go.mod", f.goMod, `(?m)^\s*github\.com/nats-io/nats-server/v2 v(\d+\.\d+)\.\d+`)
	natsImage := find("docker-compose.yml's nats service", compose.Services["nats"].Image, `^nats:`+majorMinor+`$`)
	if natsMod != "" && natsImage != "" && natsImage != natsMod {
		problems = append(problems, fmt.Sprintf("docker-compose.yml runs nats %s, the tests embed nats-server %s", natsImage, natsMod))
	}

	// Jaeger v2 is released beside module version v1.(63+m).p as v2.m.p.
	var jaeger []string
	for _, v := range []struct{ where, text, re string }{
		{"tests/tracing_test.go", f.tracing, `jaegerVersion = "(v[^"]+)"`},
		{"tools/jaeger/build.sh", f.jaegerBuild, `(?m)^version=(\S+)$`},
		{"tools/jaeger/go.mod", f.jaegerMod, `(?m)^\s*github\.com/jaegertracing/jaeger (v\S+)`},
	} {
		if got := find(v.where, v.text, v.re); got != "" {
			jaeger = append(jaeger, v.where+" "+got)
		}
	}
	for _, j := range jaeger {
		if strings.Fields(j)[1] != strings.Fields(jaeger[0])[1] {
			problems = append(problems, fmt.Sprintf("Jaeger versions differ: %s", strings.Join(jaeger, ", ")))
			break
		}
	}
	if len(jaeger) > 0 {
		var minor, patch int
		mod := strings.Fields(jaeger[0])[1]
		if _, err := fmt.Sscanf(mod, "v1.%d.%d", &minor, &patch); err != nil || minor < 63 {
			problems = append(problems, fmt.Sprintf("Jaeger module %s: not the v1.6x.y or later of a Jaeger v2 release", mod))
		} else if want := fmt.Sprintf("jaegertracing/jaeger:2.%d.%d", minor-63, patch); compose.Services["jaeger"].Image != want {
			problems = append(problems, fmt.Sprintf("docker-compose.yml runs %s, want %s (Jaeger module %s, which the tracing test runs)",
				compose.Services["jaeger"].Image, want, mod))
		}
	}
	return problems
}
