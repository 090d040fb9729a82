package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAdminHealthAndReadiness(t *testing.T) {
	var dbDown atomic.Bool
	admin := NewAdmin(map[string]Check{
		"nats": func(context.Context) error { return nil },
		"postgres": func(context.Context) error {
			if dbDown.Load() {
				return errors.New("connection refused")
			}
			return nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() { served <- Serve(srvCtx, "127.0.0.1:0", admin, ready) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz with all up = %d %s", code, body)
	}
	dbDown.Store(true)
	code, body := get("/readyz")
	if code != 503 || !strings.Contains(body, "postgres: connection refused") {
		t.Errorf("/readyz with postgres down = %d %q", code, body)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
