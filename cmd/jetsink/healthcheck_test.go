package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The probe asks the listener itself: 200 is ready, anything else is not,
// a redirect included (it is not followed).
func TestHealthcheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/busy", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "postgres: not connected", http.StatusServiceUnavailable)
	})
	mux.Handle("/moved", http.RedirectHandler("/readyz", http.StatusFound))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct {
		path string
		want int
		say  string
	}{
		{"/readyz", exitOK, ""},
		{"/busy", exitFailed, "503 Service Unavailable: postgres: not connected"},
		{"/moved", exitFailed, "302 Found"},
	} {
		r := startJetsink(t, ctx, "healthcheck", "--url", srv.URL+c.path)
		code := r.wait(t, ctx)
		msg := r.out.String()
		if r.err != nil {
			msg += r.err.Error()
		}
		if code != c.want || !strings.Contains(msg, c.say) {
			t.Errorf("healthcheck %s: exit %d, want %d with %q in %q", c.path, code, c.want, c.say, msg)
		}
	}
}
