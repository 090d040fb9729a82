package telemetry

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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

// A kept-alive connection that sends no next request is closed after
// adminIdleTimeout, not kept (and its goroutine) for good.
func TestAdminClosesIdleConnections(t *testing.T) {
	defer func(d time.Duration) { adminIdleTimeout = d }(adminIdleTimeout)
	adminIdleTimeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() {
		served <- Serve(srvCtx, "127.0.0.1:0", NewAdmin(map[string]Check{"nats": func(context.Context) error { return nil }}), ready)
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	}
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("/healthz = %d (close %v), want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("reading the idle connection: %v, want EOF (closed by the server)", err)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// A request still running when Serve's grace runs out (a 30 s CPU profile,
// a /readyz waiting on its checks) is cut off: its handler has returned by
// the time Serve does, and no goroutine is left (TestMain's goleak).
func TestServeEndsRequestsInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	entered, returned := make(chan struct{}), make(chan struct{})
	release := make(chan struct{}) // ends the handler if Serve does not
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		close(entered)
		select {
		case <-r.Context().Done():
			// Cleaning up takes a moment (pprof stops the profile and
			// writes it): Serve must wait for it, not only cancel.
			time.Sleep(50 * time.Millisecond)
		case <-release:
		}
	})
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() { served <- Serve(srvCtx, "127.0.0.1:0", h, ready) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/debug/pprof/profile?seconds=30", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		answered <- err
	}()
	defer func() {
		close(release)
		<-answered
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the request never reached the handler")
	}
	stop()
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		t.Fatal("Serve did not return")
	}
	select {
	case <-returned:
	default:
		t.Fatal("the handler is still running after Serve returned")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Serve = %v, want the grace's deadline", err)
	}
}

// Once hard has ended (a second signal), a request in flight gets no
// grace: ServeOn cuts it off at once and returns with hard's error. Before,
// it had its 2 s whatever the signals said.
func TestServeOnCutsTheGraceWhenHardEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	entered, returned := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		close(entered)
		<-r.Context().Done()
	})
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	hard, cut := context.WithCancel(ctx)
	defer cut()
	served := make(chan error, 1)
	go func() { served <- ServeOn(srvCtx, hard, l, h, nil) }()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.Addr().String()+"/debug/pprof/profile?seconds=30", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		answered <- err
	}()
	defer func() { <-answered }()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the request never reached the handler")
	}
	cut()
	began := time.Now()
	stop()
	select {
	case err = <-served:
	case <-ctx.Done():
		t.Fatal("ServeOn did not return")
	}
	if took := time.Since(began); took >= shutdownGrace/2 {
		t.Errorf("ServeOn returned %v after its stop with hard ended, want well under the %v grace", took, shutdownGrace)
	}
	select {
	case <-returned:
	default:
		t.Fatal("the handler is still running after ServeOn returned")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ServeOn = %v, want hard's error", err)
	}
}

// While a process starts, /healthz, /readyz and /metrics answer 503 with
// the phase it is in, read at each request; what Handle adds is served.
func TestStartingAnswers503WithThePhase(t *testing.T) {
	var phase atomic.Pointer[string]
	set := func(s string) { phase.Store(&s) }
	set("connecting to PostgreSQL")
	admin := NewStarting(func() string { return *phase.Load() })
	admin.Handle("/debug/pprof/", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "profiles") }))
	get := func(path string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, body := get(path); code != http.StatusServiceUnavailable || body != "starting: connecting to PostgreSQL\n" {
			t.Errorf("GET %s: %d %q, want 503 \"starting: connecting to PostgreSQL\"", path, code, body)
		}
	}
	set("connecting to NATS")
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || body != "starting: connecting to NATS\n" {
		t.Errorf("GET /healthz in the next phase: %d %q, want 503 \"starting: connecting to NATS\"", code, body)
	}
	if code, body := get("/debug/pprof/"); code != http.StatusOK || body != "profiles" {
		t.Errorf("GET /debug/pprof/ added by Handle: %d %q", code, body)
	}
	if code, _ := get("/elsewhere"); code != http.StatusNotFound {
		t.Errorf("GET /elsewhere: %d, want 404", code)
	}
}
