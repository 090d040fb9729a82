package processor

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetsink/jetsink/telemetry"
)

// The start-up line names the service that spans and metrics are exported
// as: OTEL_SERVICE_NAME's, not telemetry.service_name, which it overrides.
func TestLogTelemetryNamesTheExportedService(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "billing-sink")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	const configured = "jetsink-configured"
	tr, err := telemetry.NewTracingTo(tracetest.NewNoopExporter(), telemetry.Config{ServiceName: configured, SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	m, err := telemetry.NewMetrics(configured)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	var buf bytes.Buffer
	logTelemetry(slog.New(slog.NewTextHandler(&buf, nil)), tr, m)
	if line := buf.String(); !strings.Contains(line, "service=billing-sink") || strings.Contains(line, configured) {
		t.Errorf("start-up line %q, want service=billing-sink", line)
	}
}
