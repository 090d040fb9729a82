package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/sink"
	"go.yaml.in/yaml/v3"
)

func TestDefaultsAreValid(t *testing.T) {
	cfg := Default()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestPrecedenceFileEnvSet(t *testing.T) {
	file := []byte(`
nats:
  url: nats://file:4222
  stream: FROMFILE
  ack_wait: 10s
postgres:
  table: file_table
  batch: {max_rows: 100, max_bytes: 1MiB}
memory_limit: 48MiB
`)
	env := []string{
		"JETSINK_NATS_STREAM=FROMENV",
		"JETSINK_DATABASE_URL=postgres://env@127.0.0.1:5432/envdb",
		"JETSINK_POSTGRES_TABLE=env_table",
		"JETSINK_NATS_SUBJECTS=a.>, b.>",
		"PATH=/usr/bin",                                // not ours
		"JETSINK_TEST_DATABASE_URL=postgres://ignored", // the tests' own
		"JETSINK_JAEGER_BIN=/opt/jaeger",               // the tracing test's, named in the README
		"JETSINK_CONFIG=/elsewhere.yaml",               // the CLI's
		// Kubernetes' service links, for Services "jetsink" and
		// "jetsink-metrics" in the pod's namespace.
		"JETSINK_SERVICE_HOST=10.96.0.12",
		"JETSINK_SERVICE_PORT=9464",
		"JETSINK_SERVICE_PORT_METRICS=9464",
		"JETSINK_PORT=tcp://10.96.0.12:9464",
		"JETSINK_PORT_9464_TCP=tcp://10.96.0.12:9464",
		"JETSINK_PORT_9464_TCP_PROTO=tcp",
		"JETSINK_PORT_9464_TCP_PORT=9464",
		"JETSINK_PORT_9464_TCP_ADDR=10.96.0.12",
		"JETSINK_METRICS_SERVICE_HOST=10.96.0.13",
		"JETSINK_METRICS_PORT_9464_UDP_ADDR=10.96.0.13",
	}
	set := []string{"postgres.table=flag_table", "postgres.batch.max_bytes=512KiB"}
	cfg, err := Parse(file, env, set)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"nats.url from file", cfg.NATS.URL, "nats://file:4222"},
		{"nats.stream env over file", cfg.NATS.Stream, "FROMENV"},
		{"nats.ack_wait duration", cfg.NATS.AckWait, 10 * time.Second},
		{"postgres.url alias", cfg.Postgres.URL, "postgres://env@127.0.0.1:5432/envdb"},
		{"postgres.table flag over env", cfg.Postgres.Table, "flag_table"},
		{"batch.max_rows from file", cfg.Postgres.Batch.MaxRows, 100},
		{"batch.max_bytes flag size", int64(cfg.Postgres.Batch.MaxBytes), int64(512 << 10)},
		{"subjects list", strings.Join(cfg.NATS.Subjects, "|"), "a.>|b.>"},
		{"untouched default", cfg.Log.Level, "info"},
		{"memory_limit size", cfg.MemoryLimit, int64(48 << 20)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestMemoryLimitAuto(t *testing.T) {
	if got := Default().MemoryLimit; got != MemoryLimitAuto {
		t.Errorf("default memory_limit %d, want auto (%d)", got, MemoryLimitAuto)
	}
	for _, c := range []struct {
		name     string
		file     string
		env, set []string
		want     int64
	}{
		{"file auto", "memory_limit: auto\n", nil, nil, MemoryLimitAuto},
		{"file AUTO", "memory_limit: AUTO\n", nil, nil, MemoryLimitAuto},
		{"env auto over file size", "memory_limit: 48MiB\n", []string{"JETSINK_MEMORY_LIMIT=auto"}, nil, MemoryLimitAuto},
		{"--set size over auto", "memory_limit: auto\n", nil, []string{"memory_limit=64MiB"}, 64 << 20},
		{"--set auto", "", nil, []string{"memory_limit=auto"}, MemoryLimitAuto},
		{"zero", "memory_limit: 0\n", nil, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.file), c.env, c.set)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MemoryLimit != c.want {
				t.Errorf("memory_limit %d, want %d", cfg.MemoryLimit, c.want)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("does not validate: %v", err)
			}
		})
	}
	cfg := Default()
	cfg.MemoryLimit = -2
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "memory_limit") {
		t.Errorf("memory_limit -2: got %v", err)
	}
	if _, err := Parse([]byte("memory_limit: automatic\n"), nil, nil); err == nil || !strings.Contains(err.Error(), "memory_limit") {
		t.Errorf("memory_limit automatic: got %v", err)
	}
}

// A duration written as a bare 0 is zero (YAML alone refuses it), in the
// file, the environment and --set.
func TestZeroDurationWithoutUnit(t *testing.T) {
	cfg, err := Parse([]byte("postgres:\n  batch: {min_delay: 0.0, max_rows: 7}\nnats:\n  ack_wait: \"0\"\n"),
		[]string{"JETSINK_POSTGRES_BATCH_MAX_DELAY=0"}, []string{"postgres.batch.overlap_delay=0"})
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Postgres.Batch
	if b.MinDelay != 0 || b.MaxDelay != 0 || b.OverlapDelay != 0 || cfg.NATS.AckWait != 0 {
		t.Fatalf("min_delay %v, max_delay %v, overlap_delay %v, ack_wait %v; want all 0", b.MinDelay, b.MaxDelay, b.OverlapDelay, cfg.NATS.AckWait)
	}
}

// YAML anchors, aliases and merge keys work as YAML defines them, in
// sections and in postgres.columns; an alias normalized for one key (a
// size) leaves its anchor's value as it was for another.
func TestYAMLAliases(t *testing.T) {
	file := `
nats:
  ack_wait: &w 30s
  stream: &n "0"
pipeline:
  workers: 3
postgres:
  batch:
    <<: {max_rows: 100}
    max_delay: *w
    max_bytes: *n
  columns:
    - &c {name: a, from: "json:a", type: text}
    - {<<: *c, name: b, from: "json:b"}
`
	cfg, err := Parse([]byte(file), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Postgres.Batch
	if b.MaxDelay != 30*time.Second || cfg.NATS.AckWait != 30*time.Second || b.MaxRows != 100 || b.MaxBytes != 0 || cfg.NATS.Stream != "0" {
		t.Fatalf("max_delay %v, ack_wait %v, max_rows %d, max_bytes %d, stream %q; want 30s, 30s, 100, 0, \"0\"",
			b.MaxDelay, cfg.NATS.AckWait, b.MaxRows, b.MaxBytes, cfg.NATS.Stream)
	}
	cols := cfg.Postgres.Columns
	if len(cols) != 2 || cols[1].Name != "b" || cols[1].From != "json:b" || cols[1].Type != cols[0].Type {
		t.Fatalf("columns %+v; want b to take a's type", cols)
	}
}

// A variable or flag replaces the file's value for its key only, even
// when that value is an anchor other keys name (in a list too); a value
// rewritten for one key (a size) is not rewritten for its aliases; aliases
// of an anchored null keep their defaults.
func TestOverrideOfAnAnchoredValue(t *testing.T) {
	cfg, err := Parse([]byte("postgres:\n  batch:\n    max_delay: &d 40ms\n    overlap_delay: *d\n"), nil, []string{"postgres.batch.max_delay=50ms"})
	if err != nil {
		t.Fatal(err)
	}
	if b := cfg.Postgres.Batch; b.MaxDelay != 50*time.Millisecond || b.OverlapDelay != 40*time.Millisecond {
		t.Fatalf("max_delay %v, overlap_delay %v; want 50ms, 40ms", b.MaxDelay, b.OverlapDelay)
	}
	cfg, err = Parse([]byte("nats:\n  stream: &s S1\n  subjects: [*s]\n"), []string{"JETSINK_NATS_STREAM=S2"}, nil)
	if err != nil || cfg.NATS.Stream != "S2" || !slices.Equal(cfg.NATS.Subjects, []string{"S1"}) {
		t.Fatalf("stream %q, subjects %v, err %v; want S2, [S1]", cfg.NATS.Stream, cfg.NATS.Subjects, err)
	}
	cfg, err = Parse([]byte("pipeline:\n  max_event_bytes: &n 010\n  workers: *n\n"), nil, nil)
	if err != nil || cfg.Pipeline.MaxEventBytes != 10 || cfg.Pipeline.Workers != 10 {
		t.Fatalf("max_event_bytes %d, workers %d, err %v; want 10 and 10 (a leading zero is decimal for a size and a whole number alike)", cfg.Pipeline.MaxEventBytes, cfg.Pipeline.Workers, err)
	}
	def := Default()
	cfg, err = Parse([]byte("nats:\n  tls: &t\n  subjects: *t\npostgres:\n  batch:\n    max_rows: &r\n    max_bytes: *r\n"), nil, nil)
	if err != nil || !slices.Equal(cfg.NATS.Subjects, def.NATS.Subjects) || cfg.Postgres.Batch.MaxRows != def.Postgres.Batch.MaxRows || cfg.Postgres.Batch.MaxBytes != def.Postgres.Batch.MaxBytes {
		t.Fatalf("aliases of nulls: subjects %v, max_rows %d, max_bytes %d, err %v; want the defaults", cfg.NATS.Subjects, cfg.Postgres.Batch.MaxRows, cfg.Postgres.Batch.MaxBytes, err)
	}
}

// A key with nothing after it (YAML's null), a list key included, keeps
// its default; so does a value that YAML reads as an integer when quoted
// for a size key, and a section left empty still takes variables.
func TestNullKeepsTheDefault(t *testing.T) {
	def := Default()
	cfg, err := Parse([]byte("nats:\n  subjects:\n  ack_wait:\npostgres:\n  batch:\n    max_rows:\n    max_bytes:\n"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.NATS.Subjects, def.NATS.Subjects) || cfg.NATS.AckWait != def.NATS.AckWait ||
		cfg.Postgres.Batch.MaxRows != def.Postgres.Batch.MaxRows || cfg.Postgres.Batch.MaxBytes != def.Postgres.Batch.MaxBytes {
		t.Fatalf("nulls changed defaults: subjects %v, ack_wait %v, max_rows %d, max_bytes %d",
			cfg.NATS.Subjects, cfg.NATS.AckWait, cfg.Postgres.Batch.MaxRows, cfg.Postgres.Batch.MaxBytes)
	}
	cfg, err = Parse([]byte("postgres:\n  # url: ...\n  batch:\n    max_bytes: \"1024\"\n"), []string{"JETSINK_DATABASE_URL=postgres://db/x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.URL != "postgres://db/x" || cfg.Postgres.Batch.MaxBytes != 1024 {
		t.Fatalf("url %q, max_bytes %d; want postgres://db/x, 1024", cfg.Postgres.URL, cfg.Postgres.Batch.MaxBytes)
	}
	cfg, err = Parse([]byte("pipeline:\n  max_event_bytes: 08\npostgres:\n  batch:\n    max_bytes: 09\n"), []string{"JETSINK_PIPELINE_MAX_EVENT_BYTES=010"}, nil)
	if err != nil || cfg.Pipeline.MaxEventBytes != 10 || cfg.Postgres.Batch.MaxBytes != 9 {
		t.Fatalf("sizes with a leading zero: max_event_bytes %d, max_bytes %d, err %v; want 10, 9", cfg.Pipeline.MaxEventBytes, cfg.Postgres.Batch.MaxBytes, err)
	}
	cfg, err = Parse([]byte("pipeline:\n  workers: 02\ntelemetry:\n  pprof: on\n"), nil, nil)
	if err != nil || cfg.Pipeline.Workers != 2 || !cfg.Telemetry.Pprof {
		t.Fatalf("02 and on: workers %d, pprof %v, err %v", cfg.Pipeline.Workers, cfg.Telemetry.Pprof, err)
	}
}

// An empty variable for a key that is not a string or a list is unset: the
// file's value stays (later wins), else the default. An empty --set drops
// the file's value for the default; an empty variable for a string key
// sets it empty.
func TestEmptyVariableKeepsTheFilesValue(t *testing.T) {
	file := []byte("postgres:\n  batch:\n    max_rows: 1234\n  table: t\nnats:\n  ack_wait: 45s\ntelemetry:\n  pprof: true\n")
	env := []string{"JETSINK_POSTGRES_BATCH_MAX_ROWS=", "JETSINK_NATS_ACK_WAIT=", "JETSINK_TELEMETRY_PPROF=", "JETSINK_PIPELINE_WORKERS="}
	cfg, err := Parse(file, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	if cfg.Postgres.Batch.MaxRows != 1234 || cfg.NATS.AckWait != 45*time.Second || !cfg.Telemetry.Pprof || cfg.Pipeline.Workers != def.Pipeline.Workers {
		t.Errorf("empty variables: max_rows %d, ack_wait %v, pprof %v, workers %d; want the file's 1234 (not the default 5000), 45s, true and the default %d",
			cfg.Postgres.Batch.MaxRows, cfg.NATS.AckWait, cfg.Telemetry.Pprof, cfg.Pipeline.Workers, def.Pipeline.Workers)
	}
	cfg, err = Parse(file, nil, []string{"postgres.batch.max_rows="})
	if err != nil || cfg.Postgres.Batch.MaxRows != def.Postgres.Batch.MaxRows {
		t.Errorf("--set postgres.batch.max_rows=: max_rows %d, %v; want the default %d", cfg.Postgres.Batch.MaxRows, err, def.Postgres.Batch.MaxRows)
	}
	cfg, err = Parse([]byte("telemetry:\n  listen: 127.0.0.1:9000\n"), []string{"JETSINK_TELEMETRY_LISTEN="}, nil)
	if err != nil || cfg.Telemetry.Listen != "" {
		t.Errorf("JETSINK_TELEMETRY_LISTEN=: listen %q, %v; want it empty", cfg.Telemetry.Listen, err)
	}
}

// A fraction for a whole-number key is refused, not truncated (YAML
// decodes 2.5 into an int as 2), from a file, a variable or --set alike.
func TestFractionForAWholeNumberRefused(t *testing.T) {
	for _, c := range []struct {
		file     string
		env, set []string
	}{
		{"postgres:\n  connections: 2.5\n", nil, nil},
		{"", []string{"JETSINK_POSTGRES_CONNECTIONS=2.5"}, nil},
		{"", nil, []string{"nats.max_deliver=1e1"}},
		{"", nil, []string{"postgres.batch.max_rows=8.0"}},
	} {
		cfg, err := Parse([]byte(c.file), c.env, c.set)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "is not a whole number") {
			t.Errorf("%q %v %v: connections %d, max_deliver %d, err %v; want \"is not a whole number\"",
				c.file, c.env, c.set, cfg.Postgres.Connections, cfg.NATS.MaxDeliver, err)
		}
	}
}

// A whole number is read in decimal from the file, a variable and --set
// alike: a leading zero changes nothing (yaml.v3, after YAML 1.1, read 010
// as 8 and 0101 as 65, and took 08 for a fraction), as for a size. Hex,
// octal, binary and underscores, which YAML would read, are refused with
// the decimal number to write; a number key (sample_ratio) reads 010 as 10
// too.
func TestWholeNumbersAreDecimal(t *testing.T) {
	for _, c := range []struct {
		value string
		want  int
	}{{"010", 10}, {"0101", 101}, {"08", 8}, {"-010", -10}, {"+07", 7}, {"12", 12}} {
		for _, src := range []struct {
			file     string
			env, set []string
		}{
			{"nats:\n  max_deliver: " + c.value + "\n", nil, nil},
			{"", []string{"JETSINK_NATS_MAX_DELIVER=" + c.value}, nil},
			{"", nil, []string{"nats.max_deliver=" + c.value}},
		} {
			cfg, err := Parse([]byte(src.file), src.env, src.set)
			if err != nil || cfg.NATS.MaxDeliver != c.want {
				t.Errorf("%q %v %v: max_deliver %d, err %v; want %d", src.file, src.env, src.set, cfg.NATS.MaxDeliver, err, c.want)
			}
		}
	}
	for _, c := range []struct{ value, want string }{
		{"0x10", `"0x10" is not a whole number written in decimal digits: write 16`},
		{"0o10", `"0o10" is not a whole number written in decimal digits: write 8`},
		{"0b10", `"0b10" is not a whole number written in decimal digits: write 2`},
		{"1_000", `"1_000" is not a whole number written in decimal digits: write 1000`},
		{"99999999999999999999", `"99999999999999999999" is not a whole number jetsink can hold`},
	} {
		for _, src := range []struct {
			file     string
			env, set []string
		}{
			{"postgres:\n  connections: " + c.value + "\n", nil, nil},
			{"", []string{"JETSINK_POSTGRES_CONNECTIONS=" + c.value}, nil},
			{"", nil, []string{"postgres.connections=" + c.value}},
		} {
			cfg, err := Parse([]byte(src.file), src.env, src.set)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "postgres.connections: "+c.want) {
				t.Errorf("%q %v %v: connections %d, err %v; want %q", src.file, src.env, src.set, cfg.Postgres.Connections, err, c.want)
			}
		}
	}
	cfg, err := Parse([]byte("telemetry:\n  sample_ratio: 010\n"), nil, nil)
	if err != nil || cfg.Telemetry.SampleRatio != 10 {
		t.Errorf("sample_ratio 010: %v, err %v; want 10 (then refused by Validate)", cfg.Telemetry.SampleRatio, err)
	}
	for _, v := range []string{"0x1", "1_0"} {
		_, err = Parse(nil, []string{"JETSINK_TELEMETRY_SAMPLE_RATIO=" + v}, nil)
		if want := fmt.Sprintf("telemetry.sample_ratio: %q is not a number written in decimal digits", v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sample_ratio %s: %v; want %q", v, err, want)
		}
	}
	// In quotes, a string: said so only when it would read without them.
	_, err = Parse([]byte("postgres:\n  connections: '0x10'\n"), nil, nil)
	if err == nil || !strings.Contains(err.Error(), `postgres.connections: "0x10" is not a whole number`) {
		t.Errorf("'0x10': %v; want \"0x10\" is not a whole number", err)
	}
}

// A size is a whole number of bytes, computed exactly: an amount that
// leaves a fraction of a byte, which humanize.ParseBytes dropped (0.5 was
// 0, no limit for memory_limit; 1.9 was 1), is refused, and so is a comma,
// which ParseBytes took out (1,5MiB was 15MiB), from the file, a variable
// and --set alike. KB is 1000 bytes, KiB 1024.
func TestSizeIsAWholeNumberOfBytes(t *testing.T) {
	for _, c := range []struct {
		value string
		want  int64
	}{
		{"1.5KiB", 1536}, {"4MiB", 4 << 20}, {"4 MiB", 4 << 20}, {"4mib", 4 << 20}, {"4Mi", 4 << 20},
		{"512KB", 512000}, {"2k", 2000}, {"0.29KB", 290}, {"1.001KB", 1001}, {".5KiB", 512}, {"1.0", 1}, {"7B", 7},
		{"08", 8}, {"-1", -1}, {"0", 0}, {"8PiB", 1 << 53},
		// A larger unit's fraction of a byte is dropped, as humanize did
		// (configs that worked before still load).
		{"1.2GiB", 1288490188}, {"1.1MiB", 1153433}, {"0.8GiB", 858993459},
	} {
		for _, src := range []struct {
			file     string
			env, set []string
		}{
			{"pipeline:\n  max_event_bytes: " + c.value + "\n", nil, nil},
			{"", []string{"JETSINK_PIPELINE_MAX_EVENT_BYTES=" + c.value}, nil},
			{"", nil, []string{"pipeline.max_event_bytes=" + c.value}},
		} {
			cfg, err := Parse([]byte(src.file), src.env, src.set)
			if err != nil || cfg.Pipeline.MaxEventBytes != c.want {
				t.Errorf("%q %v %v: max_event_bytes %d, err %v; want %d", src.file, src.env, src.set, cfg.Pipeline.MaxEventBytes, err, c.want)
			}
		}
	}
	notWhole := "is not a whole number of bytes (use e.g. 4MiB, 1.5KiB or a number of bytes)"
	comma := "has a comma, which may be a decimal point or a thousands separator: write the size without it"
	notSize := "is not a size (use e.g. 4MiB, 512KiB or a number of bytes)"
	for _, c := range []struct{ value, want string }{
		{"0.5", notWhole}, {"1.9", notWhole}, {".5", notWhole}, {"0.0001KiB", notWhole}, {"0.0001KB", notWhole}, {"1.5B", notWhole},
		{"1,5MiB", comma}, {"1,000", comma}, {"1,024KiB", comma},
		{"1e3", notSize}, {"0x10", notSize}, {"1_0", notSize}, {"-1KiB", notSize}, {"1..5KiB", notSize}, {".", notSize},
		{"4 MiB B", notSize}, {"9PiB", notSize}, {"1/2KiB", notSize}, {"lots", notSize},
	} {
		for _, src := range []struct {
			file     string
			env, set []string
		}{
			{"memory_limit: " + c.value + "\n", nil, nil},
			{"", []string{"JETSINK_MEMORY_LIMIT=" + c.value}, nil},
			{"", nil, []string{"memory_limit=" + c.value}},
		} {
			cfg, err := Parse([]byte(src.file), src.env, src.set)
			if want := fmt.Sprintf("memory_limit: %q %s", c.value, c.want); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
				t.Errorf("%q %v %v: memory_limit %d, err %v; want %q", src.file, src.env, src.set, cfg.MemoryLimit, err, want)
			}
		}
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	cases := []struct {
		name      string
		file      string
		env, set  []string
		wantInErr string
	}{
		{"unknown key in file", "postgres:\n  tabel: x\n", nil, nil, "tabel"},
		{"unknown section", "postgress: {}\n", nil, nil, "postgress"},
		{"not a mapping", "- a\n- b\n", nil, nil, "mapping"},
		{"bad size", "pipeline:\n  max_event_bytes: lots\n", nil, nil, "pipeline.max_event_bytes"},
		{"bad duration", "nats:\n  ack_wait: soon\n", nil, nil, "soon"},
		{"duration without a unit", "postgres:\n  batch: {max_delay: 20}\n", nil, nil, "postgres.batch.max_delay: \"20\" has no unit"},
		{"--set duration without a unit", "", nil, []string{"nats.ack_wait=30"}, "nats.ack_wait: \"30\" has no unit"},
		{"hex duration", "nats:\n  ack_wait: 0x10\n", nil, nil, "nats.ack_wait: \"0x10\" has no unit"},
		{"infinite duration", "nats:\n  ack_wait: .inf\n", nil, nil, "nats.ack_wait: \".inf\" has no unit"},
		{"quoted duration without a unit", "nats:\n  ack_wait: \"30\"\n", nil, nil, "nats.ack_wait: \"30\" is not a duration"},
		// A number or boolean in quotes is a string to YAML: said so, not
		// that "true" is not true or false.
		{"quoted boolean", "telemetry:\n  pprof: \"true\"\n", nil, nil, "telemetry.pprof: \"true\" is in quotes, which makes it a string: write true without them"},
		{"single-quoted whole number", "postgres:\n  connections: '4'\n", nil, nil, "postgres.connections: \"4\" is in quotes, which makes it a string: write 4 without them"},
		{"quoted number", "telemetry:\n  sample_ratio: \"0.5\"\n", nil, nil, "telemetry.sample_ratio: \"0.5\" is in quotes, which makes it a string: write 0.5 without them"},
		{"quoted non-boolean", "telemetry:\n  pprof: \"maybe\"\n", nil, nil, "telemetry.pprof: \"maybe\" is not true or false"},
		{"quoted column boolean", "postgres:\n  columns:\n    - {name: a, from: \"json:a\", type: text, required: \"false\"}\n", nil, nil, "postgres.columns[0].required: \"false\" is in quotes, which makes it a string: write false without them"},
		{"an alias and its key, different", "", []string{"JETSINK_DATABASE_URL=postgres://a/x", "JETSINK_POSTGRES_URL=postgres://b/x"}, nil, "JETSINK_DATABASE_URL and JETSINK_POSTGRES_URL both set postgres.url, to different values"},
		{"unknown env", "", []string{"JETSINK_NATS_UR=x"}, nil, "JETSINK_NATS_UR is not a jetsink setting (did you mean JETSINK_NATS_URL?)"},
		{"an env _PORT that is not a service link", "", []string{"JETSINK_NATS_PORT=4222"}, nil, "JETSINK_NATS_PORT is not a jetsink setting"},
		{"unknown --set key", "", nil, []string{"postgres.batch.rows=1"}, "postgres.batch.rows: no such key (`jetsink keys` lists them)"},
		{"--set typo", "", nil, []string{"postgres.batch.max_rwos=1"}, "postgres.batch.max_rwos: no such key (did you mean postgres.batch.max_rows?)"},
		{"--set of a file-only key", "", nil, []string{"postgres.columns=x"}, "postgres.columns: this key can only be set in the config file"},
		{"env of a file-only key", "", []string{"JETSINK_POSTGRES_COLUMNS=x"}, nil, "environment variable JETSINK_POSTGRES_COLUMNS: postgres.columns can only be set in the config file"},
		{"--set without =", "", nil, []string{"postgres.table"}, "key=value"},
		{"--set into a value", "", nil, []string{"postgres.table.x=1"}, "postgres.table.x"},
		// Where the value came from: the file's line (not the merged
		// document's), the variable, or the flag.
		{"file line", "# c\n\nnats:\n  url: nats://x:4222\n\npipeline:\n  # n\n  workers: abc\n", nil, nil, `line 8: pipeline.workers: "abc" is not a whole number`},
		{"env not a number", "", []string{"JETSINK_PIPELINE_WORKERS=abc"}, nil, `JETSINK_PIPELINE_WORKERS: pipeline.workers: "abc" is not a whole number`},
		{"--set not a boolean", "", nil, []string{"telemetry.pprof=maybe"}, `--set telemetry.pprof: "maybe" is not true or false`},
		{"env not a float", "", []string{"JETSINK_TELEMETRY_SAMPLE_RATIO=most"}, nil, `JETSINK_TELEMETRY_SAMPLE_RATIO: telemetry.sample_ratio: "most" is not a number`},
		{"env duration without a unit", "", []string{"JETSINK_POSTGRES_BATCH_MAX_DELAY=5"}, nil, `JETSINK_POSTGRES_BATCH_MAX_DELAY: postgres.batch.max_delay: "5" has no unit`},
		{"typo", "# c\n\npipeline:\n  wrkers: 2\n", nil, nil, "line 4: pipeline.wrkers: no such key (did you mean pipeline.workers?)"},
		{"list for a single value", "pipeline:\n  workers: [1, 2]\n", nil, nil, "line 2: pipeline.workers takes a single value"},
		{"value for a section", "postgres:\n  batch: 5\n", nil, nil, "line 2: postgres.batch is a section"},
		{"typo in a column", "# c\n\npostgres:\n  columns:\n    - name: x\n      frm: json:a\n", nil, nil, "line 6: postgres.columns[0].frm: no such key (did you mean postgres.columns[0].from?)"},
		{"a variable over the file's value", "pipeline:\n  workers: 2\n", []string{"JETSINK_PIPELINE_WORKERS=abc"}, nil, `JETSINK_PIPELINE_WORKERS: pipeline.workers: "abc"`},
		{"the line of an alias, not of its anchor", "pipeline:\n  workers: &w 2\npostgres:\n  batch:\n    max_delay: *w\n", nil, nil, `line 5: postgres.batch.max_delay: "2" has no unit`},
		{"unknown key without a value", "pipeline:\n  wrkers:\n", nil, nil, "line 2: pipeline.wrkers: no such key"},
		{"dotted key in the file", "postgres.url: x\n", nil, nil, "line 1: postgres.url: a key in the file is one name"},
		{"swapped letters", "nats:\n  ulr: x\n", nil, nil, "(did you mean nats.url?)"},
		{"a map in a list", "nats:\n  subjects: [{a: 1}]\n", nil, nil, "nats.subjects takes a list of single values"},
		{"alias that contains itself", "nats: &a\n  <<: *a\n", nil, nil, "contains itself"},
		{"alias that contains itself, behind a merge", "nats:\n  tls:\n  <<: {tls: &t {<<: *t}}\n", nil, nil, "contains itself"},
		{"column that contains itself, behind a merge", "postgres:\n  columns:\n  <<: {columns: [&c {<<: *c}]}\n", nil, nil, "contains itself"},
		{"key set twice", "pipeline:\n  workers: 1\n  workers: 2\n", nil, nil, "line 3: pipeline.workers: already set at line 2"},
		{"list for a column's type", "# c\n\n\npostgres:\n  columns:\n    - name: x\n      type: [a]\n", nil, nil, "line 7: postgres.columns[0]: cannot unmarshal !!seq"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.file), c.env, c.set)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error does not wrap ErrInvalidConfig: %v", err)
			}
			if !strings.Contains(err.Error(), c.wantInErr) {
				t.Errorf("error %q does not mention %q", err, c.wantInErr)
			}
		})
	}
}

// telemetry.service_name written empty (as an empty variable, compose's
// ${VAR:-}, writes it) is refused, as postgres.app_name is, not taken as
// jetsink unsaid; left out, or null, it is jetsink.
func TestEmptyServiceNameRefused(t *testing.T) {
	for _, src := range []Source{
		{Env: []string{"JETSINK_TELEMETRY_SERVICE_NAME="}},
		{Set: []string{"telemetry.service_name="}},
	} {
		if _, err := Load(src); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "telemetry.service_name must not be empty") {
			t.Errorf("%+v: err %v, want telemetry.service_name must not be empty", src, err)
		}
	}
	path := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(path, []byte("telemetry:\n  service_name:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err := Load(Source{File: path}); err != nil || cfg.Telemetry.ServiceName != "jetsink" {
		t.Errorf("service_name null: %q, %v; want jetsink", cfg.Telemetry.ServiceName, err)
	}
}

func TestValidateCrossSectionRules(t *testing.T) {
	cfg := Default()
	cfg.Postgres.Mode = sink.ExactlyOnce
	if err := cfg.Validate(); err != nil {
		t.Fatalf("exactly-once in raw mode (which has stream and stream_seq) should pass: %v", err)
	}
	cfg.Postgres.Columns = []pipeline.Column{{Name: "id", From: "json:id", Type: "uuid"}}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "meta:stream_seq") {
		t.Fatalf("exactly-once without meta:stream/meta:stream_seq columns: got %v", err)
	}
	// With one of the two, only the other is asked for (before, both were).
	cfg.Postgres.Columns = append(cfg.Postgres.Columns, pipeline.Column{Name: "seq", From: "meta:stream_seq", Type: "int8"})
	err = cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), `beside "seq"`) || strings.Contains(err.Error(), `from: "meta:stream_seq"`) {
		t.Fatalf("exactly-once with meta:stream_seq and without meta:stream: got %v", err)
	}
	cfg = Default()
	cfg.Log.Format = "xml"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "log.format") {
		t.Fatalf("log.format xml: got %v", err)
	}
	for _, r := range []float64{1.5, -0.1, math.NaN()} {
		cfg = Default()
		cfg.Telemetry.SampleRatio = r
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "telemetry.sample_ratio") {
			t.Fatalf("sample_ratio %v: got %v", r, err)
		}
	}
	if _, err := Parse(nil, []string{"JETSINK_TELEMETRY_SAMPLE_RATIO=.nan"}, nil); err == nil {
		cfg, _ := Parse(nil, []string{"JETSINK_TELEMETRY_SAMPLE_RATIO=.nan"}, nil)
		if err := cfg.Validate(); err == nil {
			t.Fatal("sample_ratio .nan from the environment passed")
		}
	}
	for _, l := range []string{"garbage", "127.0.0.1", ":http", "127.0.0.1:70000", "[::1]:-1"} {
		cfg = Default()
		cfg.Telemetry.Listen = l
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "telemetry.listen") {
			t.Errorf("telemetry.listen %q: got %v", l, err)
		}
	}
	for _, l := range []string{"", ":9464", "0.0.0.0:0", "[::1]:9464", "localhost:9464"} {
		cfg = Default()
		cfg.Telemetry.Listen = l
		if err := cfg.Validate(); err != nil {
			t.Errorf("telemetry.listen %q: %v", l, err)
		}
	}
}

// No key's variable looks like a Kubernetes service link, which parse
// skips when it names no key.
func TestNoKeyLooksLikeAServiceLink(t *testing.T) {
	for _, k := range Keys() {
		if kubernetesServiceVar(EnvName(k.Path), "tcp://10.0.0.1:9464") {
			t.Errorf("%s (%s) would be taken for a Kubernetes service link", EnvName(k.Path), k.Path)
		}
	}
}

func TestLoadReadsFileAndValidates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jetsink.yaml")
	if err := os.WriteFile(path, []byte("postgres:\n  batch: {max_rows: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Source{File: path}); err == nil || !strings.Contains(err.Error(), "max_rows") {
		t.Fatalf("max_rows 0: got %v", err)
	}
	if _, err := Load(Source{File: filepath.Join(dir, "missing.yaml")}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("missing file: got %v", err)
	}
}

func TestErrorsNeverShowThePassword(t *testing.T) {
	const secret = "s3cr3t-SENTINEL"
	_, err := Load(Source{Env: []string{
		"JETSINK_DATABASE_URL=postgres://u:" + secret + "@127.0.0.1:5432/db",
		"JETSINK_NATS_PASSWORD=" + secret,
		"JETSINK_POSTGRES_BATCH_MAX_ROWS=-1",
	}})
	if err == nil {
		t.Fatal("max_rows -1 accepted")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error shows the password: %v", err)
	}
}

// A value that YAML reads as syntax, not as the value, most often a
// generated password beginning with * or ! written without quotes, is
// refused with its line and key and a hint to quote it, never quoting
// it: yaml.v3's messages would (unknown anchor 'Xy9' referenced, cannot
// decode !!str `Xy9` as a !!int), without a line.
func TestValueReadAsYAMLSyntaxIsNotShown(t *testing.T) {
	const secret = "s3cretXy9"
	for _, c := range []struct{ file, want string }{
		{"nats:\n  user: u\n  password: *" + secret + "\n", `line 3: nats.password: YAML reads a value beginning with * as an alias`},
		{"nats:\n  user: *" + secret + "\n", `line 2: nats.user: YAML reads a value beginning with * as an alias`},
		{"nats:\n  # password: *" + secret + "\n  user: u\n  password: *" + secret + " # generated\n", `line 4: nats.password: YAML reads`},
		{"nats:\n  tls:\n    # the CA\n\n    ca_file: *" + secret + "\n", `line 5: nats.tls.ca_file: YAML reads`},
		{"nats:\n  stream: &" + secret + "long S\n  consumer: *" + secret + "long\n  user: u\n  password: *" + secret + "\n", `line 5: nats.password: YAML reads`},
		{"nats: {user: u, password: *" + secret + "}\n", `line 1: YAML reads`},
		{"postgres:\n  columns:\n    - {name: a, from: *" + secret + "}\n", `line 3: YAML reads`},
		{"nats:\n  user: u\n  password: !!int " + secret + "\n", `line 3: nats.password: the value does not read as the !!int its tag asks for`},
		{"nats:\n  user: u\n  password: !!float " + secret + "\n", `line 3: nats.password: the value does not read as the !!float`},
		{"nats:\n  user: u\n  password: !!null " + secret + "\n", `line 3: nats.password: the value does not read as the !!null`},
		{"nats:\n  user: u\n  password: !!binary " + secret + "\n", `line 3: nats.password: the value does not read as the !!binary`},
		{"nats:\n  user: u\n  password: !!seq " + secret + "\n", `line 3: nats.password: the tag !!seq does not fit a single value`},
		{"nats:\n  user: u\n  password: !!" + secret + "\n", `line 3: nats.password: a value beginning with ! is a tag to YAML`},
		{"nats:\n  user: u\n  password: !" + secret + "\n", `line 3: nats.password: a value beginning with ! is a tag to YAML`},
		{"nats:\n  user: u\n  password: !" + secret + " more\n", `line 3: nats.password: a value beginning with ! is a tag to YAML`},
		{"postgres:\n  columns:\n    - {name: a, from: !!int " + secret + "}\n", `line 3: postgres.columns[0].from: the value does not read as the !!int`},
		{"pipeline:\n  workers: !!bool " + secret + "\n", `line 2: pipeline.workers: the value does not read as the !!bool`},
	} {
		_, err := Parse([]byte(c.file), nil, nil)
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "put a value beginning with #, !, &, * or % in quotes") {
			t.Errorf("%q: %v; want ErrInvalidConfig with %q and the hint to quote, without the value", c.file, err, c.want)
		}
	}
	// Through Load, the file is named, as for other lines.
	file := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(file, []byte("nats:\n  user: u\n  password: *"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Source{File: file}); err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "(in "+file+")") {
		t.Errorf("Load: %v; want the file named, without the value", err)
	}
	// A standard tag that fits its value, and ! alone (a string), stay
	// as they were.
	cfg, err := Parse([]byte("nats:\n  user: u\n  password: ! "+secret+"\n  stream: !!str 0755\npipeline:\n  workers: !!int 3\n"), nil, nil)
	if err != nil || cfg.NATS.Password != secret || cfg.NATS.Stream != "0755" || cfg.Pipeline.Workers != 3 {
		t.Errorf("tags that fit: password %q, stream %q, workers %d, err %v", cfg.NATS.Password, cfg.NATS.Stream, cfg.Pipeline.Workers, err)
	}
}

// describeYAMLError drops the values yaml.v3's messages quote.
func TestDescribeYAMLErrorDropsTheValue(t *testing.T) {
	err := &yaml.TypeError{Errors: []string{"line 3: cannot unmarshal !!str `s3cret` into int", "line 4: cannot unmarshal !!str `s3cret-...` into bool"}}
	if got := describeYAMLError(err); got != "line 3: cannot unmarshal !!str into int; line 4: cannot unmarshal !!str into bool" {
		t.Errorf("describeYAMLError = %q", got)
	}
	if got := describeYAMLError(errors.New("yaml: cannot decode !!str `s3cret` as a !!int")); got != "yaml: cannot decode !!str as a !!int" {
		t.Errorf("describeYAMLError = %q", got)
	}
}

// A credential (nats.user, nats.password) that YAML reads as a comment
// (password: #Xy9) or an anchor (password: &Xy9), so as null, is refused:
// it would keep its default, empty, and show only as the server refusing
// jetsink. A key with nothing after it, or with a comment that reads as
// one (# set by ...), keeps its default as any null does, and a variable
// that sets the key replaces the file's value.
func TestCredentialYAMLReadsAsNothingIsRefused(t *testing.T) {
	const secret = "s3cretXy9"
	for _, c := range []struct{ file, want string }{
		{"nats:\n  user: u\n  password: #" + secret + "\n", `line 3: nats.password: a value beginning with # is a comment to YAML, and the key is left empty`},
		{"nats:\n  user: u\n  password:   #" + secret + "\n", `line 3: nats.password: a value beginning with # is a comment`},
		{"nats:\n  user: u\n  password: &" + secret + "\n", `line 3: nats.password: a value beginning with & is an anchor's name to YAML, and the key is left empty`},
		{"nats:\n  user: #" + secret + "\n  password: pw\n", `line 2: nats.user: a value beginning with # is a comment`},
	} {
		_, err := Parse([]byte(c.file), nil, nil)
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "put a value beginning with #, !, &, * or % in quotes") {
			t.Errorf("%q: %v; want ErrInvalidConfig with %q and the hint to quote, without the value", c.file, err, c.want)
		}
	}
	for _, file := range []string{
		"nats:\n  user:\n  password:\n",
		"nats:\n  user: # set by JETSINK_NATS_USER\n  password: # set by JETSINK_NATS_PASSWORD\n",
		"nats:\n  user: ~\n  password: null\n",
		"nats:\n  stream: #" + secret + "\n", // not a credential: its default, EVENTS, shows
	} {
		cfg, err := Parse([]byte(file), nil, nil)
		if err != nil || cfg.NATS.User != "" || cfg.NATS.Password != "" || cfg.NATS.Stream != Default().NATS.Stream {
			t.Errorf("%q: user %q, password %q, stream %q, err %v; want the defaults", file, cfg.NATS.User, cfg.NATS.Password, cfg.NATS.Stream, err)
		}
	}
	cfg, err := Parse([]byte("nats:\n  user: u\n  password: #"+secret+"\n"), []string{"JETSINK_NATS_PASSWORD=pw"}, nil)
	if err != nil || cfg.NATS.Password != "pw" {
		t.Errorf("password set by its variable over a comment: %q, %v; want pw", cfg.NATS.Password, err)
	}
}

// A credential that YAML cuts short is refused, naming its line and key,
// not the value, the comment or the anchor's name: a plain value followed
// by a one-word comment (password: abc #def, of which YAML keeps abc; a tab
// before the # as a space), and a value after an anchor that no alias
// uses (password: &abc def, of which YAML keeps def). A comment with a
// space after its #, a quoted value holding " #", and an anchor that an
// alias reuses load as written.
func TestCredentialYAMLCutsShortIsRefused(t *testing.T) {
	for _, c := range []struct{ file, hidden, want string }{
		{"nats:\n  user: u\n  password: abc #def\n", "def", `line 3: nats.password: a # after a space or a tab begins a comment to YAML`},
		{"nats:\n  user: u\n  password: s3cret\t#x\n", "x", `line 3: nats.password: a # after a space or a tab begins a comment`},
		{"nats:\n  user: ab #cdefgh\n  password: pw\n", "cdefgh", `line 2: nats.user: a # after a space or a tab begins a comment`},
		{"nats:\n  user: u\n  password: !!str abc #def\n", "def", `line 3: nats.password: a # after a space or a tab begins a comment`},
		{"nats:\n  user: u\n  password: &s3cret s3cret2\n", "s3cret", `line 3: nats.password: a value beginning with & is an anchor's name to YAML, which no alias (*) in the file uses`},
		{"nats:\n  user: &s3cret u\n  password: pw\n", "s3cret", `line 2: nats.user: a value beginning with & is an anchor's name`},
		// The alias of another anchor of the same name does not save it.
		{"nats:\n  stream: &s3cret S\n  consumer: *s3cret\n  user: u\n  password: &s3cret pw\n", "s3cret", `line 5: nats.password: a value beginning with & is an anchor's name`},
	} {
		_, err := Parse([]byte(c.file), nil, nil)
		if !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), c.hidden) || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "put a value beginning with #, !, &, * or % in quotes") {
			t.Errorf("%q: %v; want ErrInvalidConfig with %q and the hint to quote, without %q", c.file, err, c.want, c.hidden)
		}
	}
	for _, c := range []struct{ file, user, password string }{
		{"nats:\n  user: u # the service's\n  password: pw # rotated monthly\n", "u", "pw"},
		{"nats:\n  user: u\t# tab, then a spaced comment\n  password: pw\n", "u", "pw"},
		{"nats:\n  user: u\n  password: \"abc #def\"\n", "u", "abc #def"},
		{"nats:\n  user: u\n  password: 'abc #def' #quoted\n", "u", "abc #def"},
		{"nats:\n  user: u\n  password: abc#def\n", "u", "abc#def"}, // no space: part of the value
		{"nats:\n  user: u\n  password: |\n    abc #def\n", "u", "abc #def\n"},
		{"nats:\n  user: &u jetsink\n  password: *u\n", "jetsink", "jetsink"},
		{"nats:\n  password: &p s3cret\n  user: *p\n", "s3cret", "s3cret"},
		{"nats:\n  stream: &p S #abc\n  user: u\n  password: pw\n", "u", "pw"}, // not a credential
	} {
		cfg, err := Parse([]byte(c.file), nil, nil)
		if err != nil || cfg.NATS.User != c.user || cfg.NATS.Password != c.password {
			t.Errorf("%q: user %q, password %q, err %v; want %q, %q", c.file, cfg.NATS.User, cfg.NATS.Password, err, c.user, c.password)
		}
	}
	// An anchor that the file's alias uses stays reuse when a variable
	// replaces the alias's value.
	cfg, err := Parse([]byte("nats:\n  password: &p s3cret\n  user: *p\n"), []string{"JETSINK_NATS_USER=u"}, nil)
	if err != nil || cfg.NATS.User != "u" || cfg.NATS.Password != "s3cret" {
		t.Errorf("anchor reused, alias replaced by a variable: user %q, password %q, %v", cfg.NATS.User, cfg.NATS.Password, err)
	}
	// A variable replacing the cut value loads.
	cfg, err = Parse([]byte("nats:\n  user: u\n  password: abc #def\n"), []string{"JETSINK_NATS_PASSWORD=pw"}, nil)
	if err != nil || cfg.NATS.Password != "pw" {
		t.Errorf("password set by its variable over a cut value: %q, %v; want pw", cfg.NATS.Password, err)
	}
}

// A --set with the wrong separator, or none, is refused without quoting
// the value it carries.
func TestSetErrorsNeverShowTheValue(t *testing.T) {
	const secret = "s3cr3t-SENTINEL"
	for _, kv := range []string{
		"postgres.url:postgres://u:" + secret + "@db/x?sslmode=require",
		"postgres.url postgres://u:" + secret + "@db/x",
		"nats.password " + secret,
	} {
		_, err := Parse(nil, nil, []string{kv})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("--set %q: %v, want ErrInvalidConfig", kv, err)
			continue
		}
		if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "key=value") {
			t.Errorf("--set %q: %v: want no password and the key=value form", kv, err)
		}
	}
}

// Settings after a --- line are refused, not ignored; an empty document
// after one, and a file of comments, are nothing.
func TestMoreThanOneYAMLDocument(t *testing.T) {
	_, err := Parse([]byte("nats: {url: nats://prod:4222}\n---\npostgres: {mode: exactly-once}\n"), nil, nil)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "more than one YAML document") {
		t.Fatalf("two documents: %v, want ErrInvalidConfig naming them", err)
	}
	for _, raw := range []string{"nats: {url: nats://prod:4222}\n---\n", "# nothing yet\n", "---\nnats: {url: nats://prod:4222}\n"} {
		if _, err := Parse([]byte(raw), nil, nil); err != nil {
			t.Errorf("%q: %v", raw, err)
		}
	}
}

func TestKeyOfEnv(t *testing.T) {
	for _, k := range Keys() {
		if path, ok := KeyOfEnv(EnvName(k.Path)); !ok || path != k.Path {
			t.Errorf("KeyOfEnv(%s) = %q, %v; want %s", EnvName(k.Path), path, ok, k.Path)
		}
	}
	if path, ok := KeyOfEnv("JETSINK_DATABASE_URL"); !ok || path != "postgres.url" {
		t.Errorf("KeyOfEnv(JETSINK_DATABASE_URL) = %q, %v", path, ok)
	}
	if _, ok := KeyOfEnv("JETSINK_CONFIG"); ok {
		t.Error("JETSINK_CONFIG names a key")
	}
}

func TestKeysHaveEnvNamesAndDefaults(t *testing.T) {
	keys := Keys()
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.Path] {
			t.Errorf("key %s listed twice", k.Path)
		}
		seen[k.Path] = true
	}
	for _, want := range []string{"nats.url", "nats.ack_wait", "nats.max_ack_pending", "nats.dead_letter_subject",
		"pipeline.workers", "pipeline.pin", "pipeline.ring_size", "pipeline.max_event_bytes", "pipeline.handoff",
		"postgres.url", "postgres.table", "postgres.mode", "postgres.batch.max_rows", "postgres.batch.max_bytes",
		"postgres.batch.max_delay", "telemetry.sample_ratio", "log.level", "drain_timeout"} {
		if !seen[want] {
			t.Errorf("key %s missing from Keys()", want)
		}
	}
	if got := EnvName("postgres.batch.max_rows"); got != "JETSINK_POSTGRES_BATCH_MAX_ROWS" {
		t.Errorf("EnvName = %s", got)
	}
	if got := DefaultValue("postgres.batch.max_delay"); got != "20ms" {
		t.Errorf("default postgres.batch.max_delay = %q, want 20ms", got)
	}
	if got := DefaultValue("memory_limit"); got != "auto" {
		t.Errorf("default memory_limit = %q, want auto", got)
	}
	types := map[string]string{}
	for _, k := range keys {
		types[k.Path] = k.Type
	}
	if types["memory_limit"] != "size|auto" || types["postgres.batch.max_bytes"] != "size" || types["postgres.batch.max_rows"] != "int" {
		t.Errorf("types: memory_limit %q, postgres.batch.max_bytes %q, postgres.batch.max_rows %q; want size|auto, size, int",
			types["memory_limit"], types["postgres.batch.max_bytes"], types["postgres.batch.max_rows"])
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("nats: {url: nats://x:4222}\n"), "JETSINK_NATS_STREAM=S", "postgres.table=t")
	f.Add([]byte("postgres:\n  batch: {max_bytes: 4MiB}\n  columns:\n    - {name: id, from: json:id, type: uuid}\n"), "", "")
	f.Add([]byte("{"), "JETSINK_X=1", "=")
	f.Add([]byte("nats: &a\n  <<: *a\n"), "", "")
	f.Add([]byte("x: &a {<<: [*a]}\npostgres:\n  columns:\n    - &c {<<: *c}\n"), "JETSINK_POSTGRES_BATCH_MAX_ROWS=", "nats.ack_wait=")
	f.Add([]byte("postgres:\n  batch: {<<: &b {max_rows: 1}, max_delay: *b}\n"), "", "")
	f.Add([]byte("nats:\n  tls:\n  <<: {tls: &t {<<: *t}}\n"), "JETSINK_NATS_TLS_CA_FILE=x", "")
	f.Add([]byte("postgres:\n  columns:\n  <<: {columns: [&c {<<: *c}]}\n"), "", "")
	f.Add([]byte("nats:\n  tls:\n    ca_file: *x # y\n"), "", "")
	f.Add([]byte("nats: {user: !u, password: !!int x}\npostgres:\n  columns:\n    - {name: !!binary x}\n"), "", "")
	f.Add([]byte("nats:\n  user: &u\n  password: #p\n"), "", "")
	f.Add([]byte("nats:\n  user: &u u #c\n  password: *u\n"), "", "")
	f.Fuzz(func(t *testing.T, file []byte, env, set string) {
		cfg, err := Parse(file, []string{env}, []string{set})
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error does not wrap ErrInvalidConfig: %v", err)
			}
			for _, p := range Problems(err) {
				if msg := p.Error(); !strings.HasPrefix(msg, "invalid config: ") || len(msg) < len("invalid config: x") {
					t.Fatalf("problem %q says nothing (of %q)", msg, err)
				}
			}
			return
		}
		_ = cfg.Validate() // must not panic
	})
}

// An alias and its key's variable may both be set to the same value.
func TestAliasAndKeyAgree(t *testing.T) {
	cfg, err := Parse(nil, []string{"JETSINK_DATABASE_URL=postgres://a/x", "JETSINK_POSTGRES_URL=postgres://a/x"}, nil)
	if err != nil || cfg.Postgres.URL != "postgres://a/x" {
		t.Fatalf("Parse = %v, postgres.url %q", err, cfg.Postgres.URL)
	}
}

// A value that validation refuses is traced to where it was set: the
// file's line (and the file), the variable, or --set; an error in the
// file names the file.
func TestValidationErrorsSayWhereTheValueCameFrom(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jetsink.yaml")
	if err := os.WriteFile(path, []byte("nats:\n  stream: EVENTS\npostgres:\n  mode: exactly_once\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src  Source
		want string
	}{
		{Source{File: path}, "(line 4 of " + path + ")"},
		{Source{Env: []string{"JETSINK_POSTGRES_MODE=exactly_once"}}, "(JETSINK_POSTGRES_MODE)"},
		{Source{File: path, Set: []string{"postgres.mode=at_least_once"}}, "(--set)"},
		{Source{Set: []string{"postgres.batch.max_rows=0"}}, "(--set)"},
		{Source{Flags: []Flag{{Name: "--mode", Key: "postgres.mode", Value: "exactly_once"}}}, "(--mode)"},
		{Source{Flags: []Flag{{Name: "--mode", Key: "postgres.mode", Value: "exactly-once"}}, Set: []string{"postgres.mode=x"}}, "(--set)"}, // --set wins
		// Two keys set, in two places: the first the message names.
		{Source{Set: []string{"nats.max_ack_pending=5"}, Env: []string{"JETSINK_NATS_PULL_MAX_MESSAGES=10"}}, "pull_max_messages (10); raise it or set 0 to derive it (--set)"},
		{Source{Set: []string{"nats.pull_max_messages=10"}, Env: []string{"JETSINK_NATS_MAX_ACK_PENDING=5"}}, "(JETSINK_NATS_MAX_ACK_PENDING)"},
	} {
		_, err := Load(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%+v) = %v, want an error ending %q", c.src, err, c.want)
		}
	}
	// A list, empty, refused by a rule that names another key after it:
	// where the list was set, not the other key.
	lists := filepath.Join(dir, "lists.yaml")
	if err := os.WriteFile(lists, []byte("nats:\n  subjects: []\n  create_stream: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// One entry refused: that entry's line.
	entries := filepath.Join(dir, "entries.yaml")
	if err := os.WriteFile(entries, []byte("nats:\n  create_stream: true\n  subjects:\n    - events.>\n    - \"a b\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Source{File: entries}); err == nil || !strings.Contains(err.Error(), "nats.subjects[1]") || !strings.HasSuffix(err.Error(), "(line 5 of "+entries+")") {
		t.Errorf("Load(%s) = %v, want nats.subjects[1] refused at line 5", entries, err)
	}
	for _, c := range []struct {
		src  Source
		want string
	}{
		{Source{File: lists}, "(line 2 of " + lists + ")"},
		{Source{Env: []string{"JETSINK_NATS_SUBJECTS=", "JETSINK_NATS_CREATE_STREAM=true"}}, "(JETSINK_NATS_SUBJECTS)"},
	} {
		_, err := Load(c.src)
		if err == nil || !strings.Contains(err.Error(), "nats.subjects is empty") || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("Load(%+v) = %v, want nats.subjects refused, ending %q", c.src, err, c.want)
		}
	}
	if err := os.WriteFile(path, []byte("nats:\n  strem: EVENTS\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Source{File: path}); err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), path) {
		t.Errorf("a misspelt key in the file: %v, want its line and the file", err)
	}
}

// A configuration with several wrong values says so for each, in the
// order found, with where each came from and its section's sentinel,
// rather than one per attempt to start.
func TestEveryValueProblemIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(path, []byte("nats:\n  max_deliver: -5\npipeline:\n  ring_size: 1\n  handoff: pigeon\n"+
		"postgres:\n  batch: {max_rows: 0}\n  connections: 0\nlog:\n  level: loud\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(Source{File: path, Env: []string{"JETSINK_NATS_ACK_WAIT=10ms"}})
	at := func(line int) string { return fmt.Sprintf("(line %d of %s)", line, path) }
	want := []struct {
		sentinel error
		parts    []string
	}{
		{consumer.ErrInvalidConfig, []string{"nats.ack_wait must be at least 1s (got 10ms)", "(JETSINK_NATS_ACK_WAIT)"}},
		{consumer.ErrInvalidConfig, []string{"nats.max_deliver must be -1 (unlimited) or at least 1 (got -5)", at(2)}},
		{pipeline.ErrInvalidConfig, []string{"pipeline.ring_size is 1; use 2..", at(4)}},
		{pipeline.ErrInvalidConfig, []string{`pipeline.handoff is "pigeon"`, at(5)}},
		{sink.ErrInvalidConfig, []string{"postgres.batch.max_rows must be between 1 and", at(7)}},
		{sink.ErrInvalidConfig, []string{"postgres.connections must be between 1 and 64", at(8)}},
		{ErrInvalidConfig, []string{`log.level must be debug, info, warn or error, not "loud"`, at(10)}},
	}
	problems := Problems(err)
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(problems), len(want), err)
	}
	for i, p := range problems {
		if !errors.Is(p, want[i].sentinel) || strings.Contains(p.Error(), "\n") {
			t.Errorf("problem %d %q: want one line wrapping %q", i, p, want[i].sentinel)
		}
		for _, part := range want[i].parts {
			if !strings.Contains(p.Error(), part) {
				t.Errorf("problem %d %q: no %q", i, p, part)
			}
		}
	}
	if Problems(nil) != nil {
		t.Error("Problems(nil) is not empty")
	}
}

// Reading reports every key at fault too: unknown keys and variables, and
// values of the wrong form, each with where it is.
func TestEveryKeyAtFaultIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(path, []byte("nats:\n  strem: EVENTS\n  max_deliver: ten\n  subjects: [a, [b]]\npipeline:\n  wrkers: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(Source{File: path, Env: []string{"JETSINK_NATS_URLL=nats://x:4222", "JETSINK_PIPELINE_RING_SIZE=big"}})
	want := [][]string{
		{"environment variable JETSINK_NATS_URLL is not a jetsink setting", "did you mean JETSINK_NATS_URL?"},
		{"line 2: nats.strem: no such key (did you mean nats.stream?)", "(in " + path + ")"},
		{"line 3: nats.max_deliver", `"ten" is not a whole number`, "(in " + path + ")"},
		{"line 4: nats.subjects takes a list of single values"},
		{"line 6: pipeline.wrkers: no such key (did you mean pipeline.workers?)"},
		{"JETSINK_PIPELINE_RING_SIZE: pipeline.ring_size", `"big"`},
	}
	checkProblems(t, err, want)
}

// Errors that end the reading (an alias that contains itself, a --set that
// names no key) come with the problems found before them, and a problem
// whose message wraps two errors (postgres.columns) stays one problem.
func TestProblemsBeforeTheEndOfReading(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jetsink.yaml")
	if err := os.WriteFile(path, []byte("pipeline: &p\n  <<: *p\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(Source{File: path, Env: []string{"JETSINK_NATS_URLL=x"}})
	problems := Problems(err)
	if len(problems) != 2 || !strings.Contains(problems[0].Error(), "JETSINK_NATS_URLL") || !strings.Contains(problems[1].Error(), "contains itself") {
		t.Fatalf("Load = %d problems, want the variable and the alias:\n%v", len(problems), err)
	}

	_, err = Load(Source{Env: []string{"JETSINK_NATS_URLL=x"}, Set: []string{"nats.strem=X"}})
	if problems := Problems(err); len(problems) != 2 || !strings.Contains(problems[1].Error(), "--set nats.strem: no such key") {
		t.Fatalf("Load = %v, want the variable and the --set", err)
	}

	if err := os.WriteFile(path, []byte("postgres:\n  columns:\n    - {name: id, from: \"json:id\", type: uuuid}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(Source{File: path})
	if problems := Problems(err); len(problems) != 1 || !strings.Contains(problems[0].Error(), "postgres.columns") || !strings.Contains(problems[0].Error(), "uuuid") {
		t.Fatalf("Load = %q (%d problems), want one naming postgres.columns and the type", err, len(problems))
	}
}

// Every entry of postgres.columns at fault is reported, whether reading
// (an unknown field, a value of the wrong form) or validation (a column
// the mapping refuses) finds it.
func TestEveryColumnAtFaultIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jetsink.yaml")
	in := "(in " + path + ")"
	for _, c := range []struct {
		name    string
		entries string // postgres.columns' entries, from line 3
		want    [][]string
	}{
		{"reading", `
    - {name: id, from: "json:id", type: uuid, requred: true}
    - {name: ts, from: "json:ts", type: timestamptz, required: maybe}
    - {name: v, form: "json:v", type: float8}`, [][]string{
			{"line 3: postgres.columns[0].requred: no such key (did you mean postgres.columns[0].required?)", in},
			{`line 4: postgres.columns[1].required: "maybe" is not true or false`, in},
			{"line 5: postgres.columns[2].form: no such key (did you mean postgres.columns[2].from?)", in},
		}},
		// A boolean is said as a key's is (not "cannot unmarshal !!int
		// `4` into bool"); YAML 1.1's yes and no read as one.
		{"booleans", `
    - {name: a, from: "json:a", type: text, required: yes}
    - {name: b, from: "json:b", type: text,
       required: 4}
    - {name: c, from: "json:c", type: text, required: no}`, [][]string{
			{`line 5: postgres.columns[1].required: "4" is not true or false`, in},
		}},
		// An anchored entry at fault, repeated by an alias, is one problem.
		{"anchored", `
    - &c {name: a, from: "json:a", type: text, required: maybe}
    - *c
    - {name: b, from: "json:b", type: text, required: [x]}`, [][]string{
			{`line 3: postgres.columns[0].required: "maybe" is not true or false`, in},
			{"line 5: postgres.columns[2]: cannot unmarshal !!seq", in},
		}},
		{"validation", `
    - {name: id, from: "json:id", type: uuuid}
    - {name: ts, from: "json:ts", type: timestamptz}
    - {name: ts, from: "meta:nope", type: text}`, [][]string{
			{`postgres.columns[0] ("id"): unknown type "uuuid"`, "(line 3 of " + path + ")"},
			{`postgres.columns[2] ("ts"): name is already used by column 1`, "(line 5 of " + path + ")"},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte("postgres:\n  columns:"+c.entries+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(Source{File: path})
			checkProblems(t, err, c.want)
		})
	}
}

// checkProblems requires Problems(err) to be one line per want entry, in
// order, each wrapping ErrInvalidConfig and holding every part of its
// entry.
func checkProblems(t *testing.T, err error, want [][]string) {
	t.Helper()
	problems := Problems(err)
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(problems), len(want), err)
	}
	for i, p := range problems {
		if !errors.Is(p, ErrInvalidConfig) || strings.Contains(p.Error(), "\n") {
			t.Errorf("problem %d %q: want one line wrapping ErrInvalidConfig", i, p)
		}
		for _, part := range want[i] {
			if !strings.Contains(p.Error(), part) {
				t.Errorf("problem %d %q: no %q", i, p, part)
			}
		}
	}
}

// A list from a variable or --set is items separated by commas, or the
// file's flow form; brackets and quotes are never kept in an item (a
// subject "[a.b" would capture nothing sent to a.b).
func TestListFromVariable(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"a.b, c.>", []string{"a.b", "c.>"}},
		{"a.b,,c.d,", []string{"a.b", "c.d"}},
		{"[a.b, c.d]", []string{"a.b", "c.d"}},
		{` ["a.b", 'c.d'] `, []string{"a.b", "c.d"}},
	} {
		cfg, err := Parse(nil, []string{"JETSINK_NATS_SUBJECTS=" + tc.value}, nil)
		if err != nil {
			t.Errorf("%q: %v", tc.value, err)
			continue
		}
		if !slices.Equal(cfg.NATS.Subjects, tc.want) {
			t.Errorf("%q: subjects %q, want %q", tc.value, cfg.NATS.Subjects, tc.want)
		}
	}
	for _, bad := range []string{`"a.b","c.d"`, "a.b]", "[a.b, c.d", "[[a.b]]", "[{a: b}]", "'a.b'"} {
		_, err := Parse(nil, []string{"JETSINK_NATS_SUBJECTS=" + bad}, nil)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "JETSINK_NATS_SUBJECTS") {
			t.Errorf("%q: %v, want ErrInvalidConfig naming the variable", bad, err)
		}
		if _, err := Parse(nil, nil, []string{"nats.subjects=" + bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("--set nats.subjects=%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// A variable, flag or --set for a key under a section that the file gives
// a single value or a list (nats: foo) leaves the file's problem to be
// reported, with its line, beside the file's other problems: it does not
// end the reading with a message that names only the variable.
func TestOverrideUnderAFileValueThatIsNoSection(t *testing.T) {
	for _, file := range []string{"nats: foo\npipeline:\n  wrkers: 1\n", "nats: [a]\npipeline:\n  wrkers: 1\n"} {
		want := [][]string{
			{"line 1: nats is a section: write its keys under it"},
			{"line 3: pipeline.wrkers: no such key"},
		}
		_, err := Parse([]byte(file), []string{"JETSINK_NATS_URL=nats://x:1"}, nil)
		checkProblems(t, err, want)
		_, err = Parse([]byte(file), nil, []string{"nats.url=nats://x:1"})
		checkProblems(t, err, want)
		path := filepath.Join(t.TempDir(), "f.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = Load(Source{File: path, Flags: []Flag{{Name: "--nats-url", Key: "nats.url", Value: "nats://x:1"}}})
		want[0] = append(want[0], "(in "+path+")")
		checkProblems(t, err, want)
	}
	// Deeper: postgres.batch given a number.
	_, err := Parse([]byte("postgres:\n  batch: 5\n"), []string{"JETSINK_POSTGRES_BATCH_MAX_ROWS=10"}, nil)
	checkProblems(t, err, [][]string{{"line 2: postgres.batch is a section"}})
}

// A section given a value by --set or a variable is named as a section,
// with one of its keys for an example, not met with a suggestion of
// itself.
func TestSectionGivenAValue(t *testing.T) {
	for _, tc := range []struct {
		env, set []string
		want     string
	}{
		{nil, []string{"nats=x"}, "--set nats: a section, not a key: set its keys, e.g. --set nats.url=VALUE"},
		{nil, []string{"nats.tls=x"}, "--set nats.tls: a section, not a key: set its keys, e.g. --set nats.tls.ca_file=VALUE"},
		{[]string{"JETSINK_POSTGRES_BATCH=5"}, nil, "environment variable JETSINK_POSTGRES_BATCH: postgres.batch is a section, not a key: set its keys, e.g. JETSINK_POSTGRES_BATCH_MAX_ROWS"},
	} {
		_, err := Parse(nil, tc.env, tc.set)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "did you mean") {
			t.Errorf("env %v, --set %v: %v; want %q", tc.env, tc.set, err, tc.want)
		}
	}
	if s := suggestion("", "url", []string{"url", "uri"}); s != " (did you mean uri?)" {
		t.Errorf("suggestion for url among url and uri = %q, want uri: never the name itself", s)
	}
}

// A key set twice in one mapping is named by its path, with both lines,
// before the file's other problems; a key a merge (<<) brings in and the
// mapping sets itself is legal YAML, and the mapping's value wins.
func TestKeySetTwice(t *testing.T) {
	_, err := Parse([]byte("nats:\n  url: nats://a:4222\n  url: nats://b:4222\npipeline:\n  wrkers: 1\npostgres:\n  columns:\n    - name: a\n      name: b\n"), nil, nil)
	checkProblems(t, err, [][]string{
		{"line 3: nats.url: already set at line 2"},
		{"line 9: postgres.columns[0].name: already set at line 8"},
		{"line 5: pipeline.wrkers: no such key"},
	})
	cfg, err := Parse([]byte("nats:\n  <<: {url: nats://a:4222, stream: A}\n  url: nats://b:4222\n"), nil, nil)
	if err != nil || cfg.NATS.URL != "nats://b:4222" || cfg.NATS.Stream != "A" {
		t.Fatalf("merged key set again: %v, url %q, stream %q; want nats://b:4222 and A", err, cfg.NATS.URL, cfg.NATS.Stream)
	}
	cfg, err = Parse([]byte("postgres:\n  batch: {max_rows: 10, max_delay: 5ms}\n  url: postgres://x/y\n"+
		"pipeline:\n  <<: [{workers: 2}, {workers: 3, ring_size: 1024}]\n  workers: 4\n"), nil, nil)
	if err != nil || cfg.Pipeline.Workers != 4 || cfg.Pipeline.RingSize != 1024 {
		t.Fatalf("merged keys set again: %v, workers %d, ring_size %d; want 4 and 1024", err, cfg.Pipeline.Workers, cfg.Pipeline.RingSize)
	}
}

// A key that differs from one only in case is suggested.
func TestCaseOnlyTypoIsSuggested(t *testing.T) {
	for file, want := range map[string]string{
		"NATS:\n  url: nats://x:4222\n":          "line 1: NATS: no such key (did you mean nats?)",
		"nats:\n  URL: nats://x:4222\n":          "line 2: nats.URL: no such key (did you mean nats.url?)",
		"postgres:\n  columns:\n    - Name: a\n": "line 3: postgres.columns[0].Name: no such key (did you mean postgres.columns[0].name?)",
	} {
		if _, err := Parse([]byte(file), nil, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", file, err, want)
		}
	}
}

// A config path that is a directory (what Docker mounts when the file to
// mount does not exist) is named with what gave it, and the fix said;
// another error reading the file names what gave it too.
func TestLoadConfigPathIsADirectory(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ from, want string }{
		{"JETSINK_CONFIG", "invalid config: JETSINK_CONFIG=" + dir + " is a directory (Docker makes one when the file to mount does not exist: create the file first)"},
		{"--config", "invalid config: --config " + dir + " is a directory (Docker makes one"},
		{"", "invalid config: config file " + dir + " is a directory (Docker makes one"},
	} {
		_, err := Load(Source{File: dir, FileFrom: tc.from})
		if !errors.Is(err, ErrInvalidConfig) || !strings.HasPrefix(fmt.Sprint(err), tc.want) {
			t.Errorf("from %q: %v, want %q", tc.from, err, tc.want)
		}
	}
	missing := filepath.Join(dir, "jetsink.yaml")
	_, err := Load(Source{File: missing, FileFrom: "--config"})
	if want := "invalid config: --config " + missing + ": open " + missing + ": "; !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(fmt.Sprint(err), want) {
		t.Errorf("a missing file: %v, want %q", err, want)
	}
}
