package tests

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
	"github.com/jetsink/jetsink/tests/testenv"
)

// permsDurable is the durable the permission tests' jetsink pulls from.
const permsDurable = "jetsink"

// natsPerm is one entry of the allow lists the NATS user of jetsink needs.
type natsPerm struct {
	subscribe bool   // an entry of the subscribe list, else of the publish list
	subject   string // the entry
	// named is what jetsink's log, or New's error, says without it: the
	// subject to allow.
	named string
	// warnOnly: without it jetsink still stores and dead-letters every
	// event, and its log names the subject (at Warn or Error).
	warnOnly bool
	// checkOnly: run does without it; jetsink check needs it.
	checkOnly bool
}

// minimalPerms is what a NATS user needs to run jetsink on stream, with
// nats.create_stream false and the dead-letter stream made by an admin
// (README: NATS permissions): the entries neither warnOnly nor checkOnly
// are the least jetsink runs with; the warnOnly ones keep its look-ups
// and warnings whole; the checkOnly one is for jetsink check. With filter
// (nats.filter_subject) the durable is made on a subject of more tokens.
// The JetStream API entries are those of the default domain ($JS.API;
// with nats.domain, $JS.<domain>.API).
func minimalPerms(stream, dlqStream, dlqSubject, filter string) []natsPerm {
	api := "$JS.API."
	sd := stream + "." + permsDurable
	create := api + "CONSUMER.CREATE." + sd
	if filter != "" {
		create += ".>"
	}
	return []natsPerm{
		// The account's JetStream: is it there, and its limits (check;
		// run asks only to tell a silent JetStream from a silent server,
		// and for the account's max_ack_pending in a refusal's fix).
		{subject: api + "INFO", named: api + "INFO", checkOnly: true},
		// The event stream: its subjects, sequences, retention.
		{subject: api + "STREAM.INFO." + stream, named: api + "STREAM.INFO." + stream},
		// Which stream stores nats.dead_letter_subject, and its limits:
		// run warns of a dead-letter stream that would lose or refuse
		// letters, and names it and its full limit when it refuses one.
		{subject: api + "STREAM.NAMES", named: api + "STREAM.NAMES", warnOnly: true},
		{subject: api + "STREAM.INFO." + dlqStream, named: api + "STREAM.INFO." + dlqStream, warnOnly: true},
		// The durable: its configuration and ack floor.
		{subject: api + "CONSUMER.INFO." + sd, named: api + "CONSUMER.INFO." + sd},
		// Making or updating the durable (with nats.filter_subject set,
		// nats.go sends the filter as more tokens:
		// CONSUMER.CREATE.<stream>.<durable>.<filter>).
		{subject: create, named: api + "CONSUMER.CREATE." + sd},
		// Other durables of the stream that may write the same table.
		{subject: api + "CONSUMER.LIST." + stream, named: api + "CONSUMER.LIST." + stream, warnOnly: true},
		// The pulls.
		{subject: api + "CONSUMER.MSG.NEXT." + sd, named: api + "CONSUMER.MSG.NEXT." + sd},
		// Acks, naks, InProgress and terms.
		{subject: "$JS.ACK." + stream + ".>", named: "$JS.ACK." + stream},
		// Dead letters.
		{subject: dlqSubject, named: dlqSubject},
		// Replies to every request and the pulled messages.
		{subscribe: true, subject: "_INBOX.>", named: "_INBOX."},
		// A new consumer leader, on a cluster.
		{subscribe: true, subject: "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED." + sd,
			named: "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED." + sd, warnOnly: true},
	}
}

// permsServer is an embedded JetStream server with an admin user (every
// permission) and a jetsink user (the allow lists given), in a cluster of
// its own name so that clients see a cluster (jetsink then watches for
// consumer leader changes, as it does on a real cluster). Its log's
// permission violations are kept.
type permsServer struct {
	srv        *server.Server
	opts       *server.Options
	mu         sync.Mutex
	violations []string
}

const permsPassword = "s3cret-perms"

func startPermsServer(t *testing.T) *permsServer {
	t.Helper()
	ps := &permsServer{}
	ps.opts = &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, JetStream: true, StoreDir: t.TempDir(),
		ServerName: "perms", Cluster: server.ClusterOpts{Name: "perms"}}
	ps.opts.Users = ps.users(nil)
	srv, err := server.NewServer(ps.opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetLoggerV2(ps, false, false, false)
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded nats-server not ready within 10s")
	}
	ps.srv = srv
	return ps
}

func (ps *permsServer) users(perms []natsPerm) []*server.User {
	var pub, sub []string
	for _, p := range perms {
		if p.subscribe {
			sub = append(sub, p.subject)
		} else {
			pub = append(pub, p.subject)
		}
	}
	// An allow list never goes empty, which would allow everything.
	return []*server.User{
		{Username: "admin", Password: permsPassword},
		{Username: "jetsink", Password: permsPassword, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: append(pub, "_no_publish_")},
			Subscribe: &server.SubjectPermission{Allow: append(sub, "_no_subscribe_")},
		}},
	}
}

// allow gives the jetsink user the allow lists of perms.
func (ps *permsServer) allow(t *testing.T, perms []natsPerm) {
	t.Helper()
	o := ps.opts.Clone()
	o.Users = ps.users(perms)
	if err := ps.srv.ReloadOptions(o); err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// Violations is what the server logged of refused publishes and
// subscriptions since the last call.
func (ps *permsServer) Violations() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	v := ps.violations
	ps.violations = nil
	return v
}

func (ps *permsServer) note(format string, v ...any) {
	if s := fmt.Sprintf(format, v...); strings.Contains(s, "Violation") {
		ps.mu.Lock()
		ps.violations = append(ps.violations, s)
		ps.mu.Unlock()
	}
}

func (ps *permsServer) Noticef(format string, v ...any) { ps.note(format, v...) }
func (ps *permsServer) Warnf(format string, v ...any)   { ps.note(format, v...) }
func (ps *permsServer) Fatalf(format string, v ...any)  { ps.note(format, v...) }
func (ps *permsServer) Errorf(format string, v ...any)  { ps.note(format, v...) }
func (ps *permsServer) Debugf(format string, v ...any)  {}
func (ps *permsServer) Tracef(format string, v ...any)  {}

// permsEnv is an env on ps, its streams made by the admin user, and the
// jetsink user allowed minimalPerms of its streams (for a consumer with
// nats.filter_subject when filter is set), less the one at index drop
// (none: -1), which it returns.
func permsEnv(t *testing.T, ps *permsServer, pg *testenv.PG, drop int, filter bool) (*env, natsPerm) {
	t.Helper()
	nc, err := nats.Connect(ps.srv.ClientURL(), nats.UserInfo("admin", permsPassword))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e := newEnvWith(t, nil, ps.srv.ClientURL(), nc, pg)
	f := ""
	if filter {
		f = e.prefix + ".>"
	}
	perms := minimalPerms(e.stream, e.dlqStream(), "dlq."+e.stream, f)
	var dropped natsPerm
	if drop >= 0 {
		dropped = perms[drop]
		perms = slices.Delete(perms, drop, drop+1)
	}
	ps.allow(t, perms)
	return e, dropped
}

// permsConfig is e's configuration as the jetsink user, the streams left
// to their admin.
func permsConfig(e *env) config.Config {
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.User, cfg.NATS.Password = "jetsink", permsPassword
	cfg.NATS.CreateStream = false
	cfg.NATS.Consumer = permsDurable
	cfg.NATS.PullClient = cmp.Or(os.Getenv("JETSINK_TEST_PULL_CLIENT"), cfg.NATS.PullClient)
	cfg.NATS.PullExpiry, cfg.NATS.PullHeartbeat = 2*time.Second, 500*time.Millisecond
	return cfg
}

// startLogged is processor.New and launch with a log (Info and above)
// kept in out as well as the test's log. The error is New's.
func (e *env) startLogged(ctx context.Context, cfg config.Config, out io.Writer) (*running, error) {
	e.t.Helper()
	log := slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{e.t}, out), &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := processor.New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return e.launch(ctx, p), nil
}

// permsEvents is how many good events the permission tests publish (and
// one bad, dead-lettered).
const permsEvents = 20

func (e *env) publishWithPoison(ctx context.Context) {
	e.t.Helper()
	e.publish(ctx, 1, permsEvents, 2)
	if _, err := e.js.Publish(ctx, e.prefix+".bad", []byte("not json")); err != nil {
		e.t.Fatal(err)
	}
}

// jetsink runs as a NATS user allowed only minimalPerms, the streams made
// by an admin: it stores every event, dead-letters the bad one, and
// neither its log nor the server's tells of a permission refused.
func TestMinimalNATSPermissions(t *testing.T) {
	ps := startPermsServer(t)
	pg := testenv.Postgres(t)
	t.Run("stream", func(t *testing.T) { storeAllPermitted(t, ps, pg, false, sink.AtLeastOnce) })
	t.Run("filter_subject", func(t *testing.T) { storeAllPermitted(t, ps, pg, true, sink.AtLeastOnce) })
	t.Run("exactly-once", func(t *testing.T) { storeAllPermitted(t, ps, pg, false, sink.ExactlyOnce) })
}

// storeAllPermitted runs jetsink on ps as the jetsink user allowed
// minimalPerms (with nats.filter_subject when filter is set) in mode, and fails on
// any permission refused, by the server's log or jetsink's.
func storeAllPermitted(t *testing.T, ps *permsServer, pg *testenv.PG, filter bool, mode sink.Mode) {
	e, _ := permsEnv(t, ps, pg, -1, filter)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.createStreams(ctx)
	e.publishWithPoison(ctx)
	cfg := permsConfig(e)
	cfg.Postgres.Mode = mode
	if filter {
		cfg.NATS.FilterSubject = e.prefix + ".>"
	}
	var out testenv.SyncBuffer
	r, err := e.startLogged(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("processor.New as the jetsink user: %v", err)
	}
	// A refusal fails the test at once: waiting it out would take
	// ack_wait after ack_wait.
	var refused []string
	waitFor(t, ctx, "every event stored, the bad one dead-lettered", func() (bool, string) {
		if refused = append(refused, ps.Violations()...); len(refused) > 0 {
			t.Fatalf("the server refused the jetsink user:\n%s", strings.Join(refused, "\n"))
		}
		rows, dead := e.rows(ctx), e.dlqCount(ctx)
		return rows == permsEvents && dead == 1, fmt.Sprintf("%d rows, %d dead letters", rows, dead)
	})
	e.waitDrained(ctx, permsEvents, r)
	r.drain(t)
	problems, err := consumer.Check(ctx, cfg.NATS, slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, &out), nil)))
	if err != nil {
		t.Errorf("consumer.Check (jetsink check) as the jetsink user: %v", err)
	}
	for _, p := range problems {
		t.Logf("check: %+v", p)
	}
	if v := ps.Violations(); len(v) > 0 {
		t.Errorf("the server refused the jetsink user:\n%s", strings.Join(v, "\n"))
	}
	for line := range strings.Lines(out.String()) {
		l := strings.ToLower(line)
		if strings.Contains(l, "permission") || strings.Contains(l, "violation") || strings.Contains(l, "not allowed") {
			t.Errorf("jetsink's log tells of a permission refused: %s", line)
		}
	}
}

// Without any one entry of minimalPerms, jetsink either fails at start
// with an error naming the subject to allow, or logs it (at Warn or
// Error) as soon as it is refused; the warnOnly ones still let it store
// and dead-letter every event; without a checkOnly one jetsink check fails
// naming it.
func TestMinimalNATSPermissionsEachNeeded(t *testing.T) {
	ps := startPermsServer(t)
	pg := testenv.Postgres(t)
	for i, p := range minimalPerms("<stream>", "<stream>_DLQ", "dlq.<stream>", "") {
		list := "publish"
		if p.subscribe {
			list = "subscribe"
		}
		t.Run(list+" "+p.subject, func(t *testing.T) {
			e, dropped := permsEnv(t, ps, pg, i, false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e.createStreams(ctx)
			e.publishWithPoison(ctx)
			cfg := permsConfig(e)
			if dropped.checkOnly {
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := consumer.Check(cctx, cfg.NATS, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
				ccancel()
				if err == nil || !strings.Contains(err.Error(), dropped.named) {
					t.Fatalf("consumer.Check (jetsink check) without %s: %v; want an error naming %s", dropped.subject, err, dropped.named)
				}
				t.Logf("without %s: check: %v", dropped.subject, err)
			}
			// As jetsink run calls it: with no deadline, each JetStream
			// request waits nats.go's default timeout (5 s).
			nctx, ncancel := context.WithCancel(context.WithoutCancel(ctx))
			defer ncancel()
			var out testenv.SyncBuffer
			r, err := e.startLogged(nctx, cfg, &out)
			// named is the first line at Warn or Error naming the subject in
			// jetsink's own words (not nats.go's async error line).
			named := func() string {
				for line := range strings.Lines(out.String()) {
					if (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) && strings.Contains(line, dropped.named) &&
						!strings.Contains(line, "nats async error") {
						return strings.TrimSpace(line)
					}
				}
				return ""
			}
			switch {
			case dropped.checkOnly:
				// Not needed to run: stores and dead-letters every event,
				// and says nothing of it.
				if err != nil {
					t.Fatalf("processor.New without %s: %v", dropped.subject, err)
				}
			case err != nil && dropped.warnOnly:
				t.Fatalf("processor.New without %s, which should only be warned of: %v", dropped.subject, err)
			case err != nil:
				if !strings.Contains(err.Error(), dropped.named) {
					t.Fatalf("processor.New without %s: %v; want an error naming %s", dropped.subject, err, dropped.named)
				}
				t.Logf("without %s: processor.New: %v", dropped.subject, err)
				return
			default:
				waitFor(t, ctx, "a warning or error naming "+dropped.named, func() (bool, string) {
					return named() != "", ""
				})
				t.Logf("without %s: %s", dropped.subject, named())
				if !dropped.warnOnly {
					return
				}
			}
			e.waitDrained(ctx, permsEvents, r)
			waitFor(t, ctx, "the bad event dead-lettered", func() (bool, string) {
				n := e.dlqCount(ctx)
				return n == 1, fmt.Sprintf("%d dead letters", n)
			})
			if l := named(); dropped.checkOnly && l != "" {
				t.Errorf("without %s, which run does not need: %s", dropped.subject, l)
			}
		})
	}
}
