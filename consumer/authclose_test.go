package consumer

import (
	"cmp"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A password changed on the server (and the server reloaded) closes
// jetsink's connection, and nats.go, refused twice on reconnect, gives up
// on it for good: Run's error says that the credentials were refused and
// what to fix. Before, it said only "consume: nats: connection closed".
func TestRunSaysCredentialsRefusedOnReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const admin, old, changed = "admin-secret", "old-secret", "new-secret"
	users := func(pass string) []*server.User {
		return []*server.User{{Username: "admin", Password: admin}, {Username: "jetsink", Password: pass}}
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), ServerName: "authclose", Users: users(old)}
	srv := startServer(t, opts)
	js := jsAt(t, srv.ClientURL(), nats.UserInfo("admin", admin))
	name := uniqueName(t)
	cfg := DefaultConfig()
	cfg.URL, cfg.User, cfg.Password = srv.ClientURL(), "jetsink", old
	cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
	cfg.CreateStream, cfg.DeadLetterSubject = true, "dlq."+name
	cfg.PullClient = cmp.Or(os.Getenv("JETSINK_TEST_PULL_CLIENT"), cfg.PullClient)
	c := newConsumer(t, ctx, cfg)
	r := startRun(t, ctx, c, 1, 16, 16)
	publish(t, ctx, js, cfg, 1, 1, 0)
	r.next(t, ctx) // consuming
	o := opts.Clone()
	o.Users = users(changed)
	if err := srv.ReloadOptions(o); err != nil {
		t.Fatalf("reload: %v", err)
	}
	var err error
	select {
	case err = <-r.done:
	case <-ctx.Done():
		t.Fatal("Run did not return after the server refused its credentials")
	}
	if !errors.Is(err, jetstream.ErrConnectionClosed) || !errors.Is(err, nats.ErrAuthorization) ||
		!strings.Contains(err.Error(), "NATS refused jetsink's credentials on reconnect") || !strings.Contains(err.Error(), "nats.password") {
		t.Fatalf("Run = %v\nwant it to say NATS refused the credentials on reconnect, and to name nats.password", err)
	}
}
