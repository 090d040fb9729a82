package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/embedded"
	"github.com/jetsink/jetsink/loadgen"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/telemetry"
	"github.com/jetsink/jetsink/tests/testenv"
)

// jaegerVersion is the Jaeger (v2) module version tools/jaeger builds.
const jaegerVersion = "v1.76.0"

// jaegerBin finds the Jaeger binary that tools/jaeger/build.sh builds:
// $JETSINK_JAEGER_BIN, else the cache path the script uses. It fails the
// test, saying how to build it, when there is none.
func jaegerBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("JETSINK_JAEGER_BIN")
	if bin == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		bin = filepath.Join(cache, "jetsink", "jaeger-"+jaegerVersion, "jaeger")
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatalf("no Jaeger binary at %s (%v): run tools/jaeger/build.sh once (it builds Jaeger %s from the Go module proxy "+
			"into that cache, several minutes cold; .ci/run does it before make test), or set JETSINK_JAEGER_BIN to a Jaeger v2 binary",
			bin, err, jaegerVersion)
	}
	return bin
}

// freePort is a port for a server the test starts: below the range of
// outgoing connections' source ports, so that none of the machine's takes
// it before the server binds it (embedded.FreePort).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// jaeger is a Jaeger v2 all-in-one process with in-memory storage.
type jaeger struct {
	otlp  string // OTLP/HTTP base URL
	query string // query HTTP base URL
}

const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// startJaeger runs Jaeger until the test ends.
func startJaeger(t *testing.T, ctx context.Context) *jaeger {
	t.Helper()
	bin := jaegerBin(t)
	qport, gport, oport := freePort(t), freePort(t), freePort(t)
	for gport == qport { // each was free when picked, and then released
		gport = freePort(t)
	}
	for oport == qport || oport == gport {
		oport = freePort(t)
	}
	cfgPath := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, jaegerConfig, qport, gport, oport), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var outMu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(p) })
	cmd := exec.Command(bin, "--config", cfgPath)
	testenv.DieWithTest(cmd)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			outMu.Lock()
			t.Logf("jaeger output:\n%s", out.String())
			outMu.Unlock()
		}
	})
	j := &jaeger{otlp: fmt.Sprintf("http://127.0.0.1:%d", oport), query: fmt.Sprintf("http://127.0.0.1:%d", qport)}
	waitFor(t, ctx, "Jaeger's query API", func() (bool, string) {
		select {
		case err := <-exited:
			exited <- err
			outMu.Lock()
			defer outMu.Unlock()
			t.Fatalf("jaeger exited: %v\n%s", err, out.String())
		default:
		}
		var v any
		err := j.get(ctx, "/api/services", &v)
		return err == nil, fmt.Sprint(err)
	})
	return j
}

// hexID normalises a trace or span ID: Jaeger's JSON drops leading zeros.
func hexID(s string) string { return strings.TrimLeft(strings.ToLower(s), "0") }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (j *jaeger) get(ctx context.Context, path string, v any) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, j.query+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Jaeger's /api/traces answer (the parts the test reads).
type jTraces struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
			References    []struct {
				RefType string `json:"refType"`
				TraceID string `json:"traceID"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// TestTracesInJaeger: a traced publish, jetsink at 100%, and a real Jaeger
// v2: the publisher's trace holds jetsink's process span as the child of the
// publisher's send span, and jetsink's copy span links to that process span.
func TestTracesInJaeger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	j := startJaeger(t, ctx)
	e := newEnv(t)
	e.createStreams(ctx)

	// The publisher: its own service, a root span around the publishes and
	// loadgen's PRODUCER span per event, traceparent in the headers.
	pub, err := telemetry.NewTracing(ctx, telemetry.Config{ServiceName: "test-publisher-" + e.prefix, OTLPEndpoint: j.otlp, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Enabled() {
		t.Fatal("publisher tracing is off with an endpoint")
	}
	const n = 20
	pctx, root := pub.Tracer().Start(ctx, "publish test events")
	res, err := loadgen.Publish(pctx, e.nc, loadgen.Options{Subject: e.prefix, Subjects: 2, Events: n, Run: e.run, Tracer: pub.Tracer()})
	root.End()
	if err != nil {
		t.Fatalf("publish: %+v: %v", res, err)
	}
	if err := pub.Shutdown(ctx); err != nil {
		t.Fatalf("publisher spans: %v", err)
	}
	traceID := root.SpanContext().TraceID().String()

	service := "jetsink-" + e.prefix
	cfg := e.config(sink.AtLeastOnce)
	cfg.Telemetry.ServiceName = service
	cfg.Telemetry.OTLPEndpoint = j.otlp
	cfg.Telemetry.SampleRatio = 1
	r := e.start(ctx, cfg)
	if !r.p.Tracing().Enabled() {
		t.Fatal("jetsink tracing is off with telemetry.otlp_endpoint set")
	}
	e.waitDrained(ctx, n, r)
	r.drain(t) // flushes jetsink's spans
	_, body := adminGet(t, ctx, r, "/metrics")
	if got := metricValue(body, "jetsink_trace_spans_exported_total"); got < n+1 {
		t.Errorf("jetsink_trace_spans_exported_total = %v, want the %d process spans and a copy span at least", got, n)
	}
	for _, reason := range []string{"queue_full", "export_failed"} {
		if got := metricValue(body, "jetsink_trace_spans_lost_total", `reason="`+reason+`"`); got != 0 {
			t.Errorf("jetsink_trace_spans_lost_total{reason=%q} = %v, want 0", reason, got)
		}
	}

	// The publisher's trace: root -> send <prefix>.* -> process <prefix>.>,
	// spans named after the subjects' pattern, not the two devices'
	// subjects.
	processIDs := map[string]bool{}
	waitFor(t, ctx, "the publisher's trace with jetsink's process spans in Jaeger", func() (bool, string) {
		var tr jTraces
		if err := j.get(ctx, "/api/traces/"+traceID, &tr); err != nil {
			return false, err.Error()
		}
		if len(tr.Data) != 1 {
			return false, fmt.Sprintf("%d traces", len(tr.Data))
		}
		d := tr.Data[0]
		sends := map[string]bool{}
		for _, s := range d.Spans {
			if s.OperationName == "send "+e.prefix+".*" && d.Processes[s.ProcessID].ServiceName == "test-publisher-"+e.prefix {
				sends[hexID(s.SpanID)] = true
			}
		}
		clear(processIDs)
		for _, s := range d.Spans {
			if s.OperationName != "process "+e.prefix+".>" || d.Processes[s.ProcessID].ServiceName != service {
				continue
			}
			for _, ref := range s.References {
				if ref.RefType == "CHILD_OF" && sends[hexID(ref.SpanID)] {
					processIDs[hexID(s.SpanID)] = true
				}
			}
		}
		return len(sends) == n && len(processIDs) == n,
			fmt.Sprintf("%d spans, %d send spans, %d process spans that are children of one", len(d.Spans), len(sends), len(processIDs))
	})

	// jetsink's batch spans link every process span.
	waitFor(t, ctx, "copy spans linked to every process span", func() (bool, string) {
		q := url.Values{"service": {service}, "operation": {"copy " + e.table}, "limit": {"100"}, "lookback": {"1h"}}
		var tr jTraces
		if err := j.get(ctx, "/api/traces?"+q.Encode(), &tr); err != nil {
			return false, err.Error()
		}
		linked := map[string]bool{}
		copies := 0
		for _, d := range tr.Data {
			for _, s := range d.Spans {
				if s.OperationName != "copy "+e.table {
					continue
				}
				copies++
				for _, ref := range s.References {
					if hexID(ref.TraceID) == hexID(traceID) && processIDs[hexID(ref.SpanID)] {
						linked[hexID(ref.SpanID)] = true
					}
				}
			}
		}
		return len(linked) == n, fmt.Sprintf("%d copy spans linking %d of %d process spans", copies, len(linked), n)
	})

	// One operation per kind of span, whatever the number of subjects.
	for svc, want := range map[string][]string{
		service:                      {"copy " + e.table, "process " + e.prefix + ".>"},
		"test-publisher-" + e.prefix: {"publish test events", "send " + e.prefix + ".*"},
	} {
		var ops struct {
			Data []string `json:"data"`
		}
		if err := j.get(ctx, "/api/services/"+url.PathEscape(svc)+"/operations", &ops); err != nil {
			t.Fatal(err)
		}
		slices.Sort(ops.Data)
		if !slices.Equal(ops.Data, want) {
			t.Errorf("service %s has operations %q, want %q", svc, ops.Data, want)
		}
	}
}
