package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

var nameSeq atomic.Uint64

// onePassOnly skips t in make test's second run of this package, the one
// with JETSINK_TEST_PULL_CLIENT set (nats.go), for a test whose path that
// variable does not change: it names its pull client, runs with each, or
// builds its configuration without testConfig. The house rule allows this
// skip only because the same test runs in the other pass, without the
// variable, which make test (and so CI) always runs too; it is no skip for
// want of a service.
func onePassOnly(t *testing.T) {
	t.Helper()
	if v := os.Getenv("JETSINK_TEST_PULL_CLIENT"); v != "" {
		t.Skipf("JETSINK_TEST_PULL_CLIENT=%s does not change this test's path (it names its pull client, runs with each, "+
			"or does not read the variable); it runs in the pass without it", v)
	}
}

// uniqueName turns the test's name into a unique stream name.
func uniqueName(t testing.TB) string {
	var b strings.Builder
	for _, r := range t.Name() {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return fmt.Sprintf("%s_%d", b.String(), nameSeq.Add(1))
}

// testConfig is a config for a fresh stream of the test's own on srv, with
// short heartbeats so that lost pulls are noticed quickly.
func testConfig(t testing.TB, srv *testenv.NATSServer) Config {
	t.Helper()
	return testConfigURL(t, srv.URL())
}

// testConfigURL is testConfig for the servers at url (a cluster's).
func testConfigURL(t testing.TB, url string) Config {
	t.Helper()
	name := uniqueName(t)
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.Stream = name
	cfg.Subjects = []string{"in." + name + ".>"}
	cfg.CreateStream = true
	cfg.Consumer = "c_" + name
	cfg.DeadLetterSubject = "dlq." + name
	cfg.PullExpiry = 2 * time.Second
	cfg.PullHeartbeat = 500 * time.Millisecond
	cfg.PullClient = cmp.Or(os.Getenv("JETSINK_TEST_PULL_CLIENT"), cfg.PullClient)
	return cfg
}

// testLogger writes to the test log, or to buf when it is not nil. A line
// that carries one key twice (strictKeys) fails t, at its end, naming
// the key and the log call.
func testLogger(t testing.TB, buf io.Writer) *slog.Logger {
	t.Helper()
	if buf == nil {
		buf = tWriter{t}
	}
	return slog.New(newStrictKeys(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}), strictReport(t)))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// syncBuffer is a log buffer safe for the logger's concurrent writers.
type syncBuffer = testenv.SyncBuffer

// newConsumer runs New and closes the consumer in t.Cleanup.
func newConsumer(t testing.TB, ctx context.Context, cfg Config) *Consumer {
	t.Helper()
	c, err := New(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// newLoggedConsumer is newConsumer with its log kept in a buffer.
func newLoggedConsumer(t testing.TB, ctx context.Context, cfg Config) (*Consumer, *syncBuffer) {
	t.Helper()
	log := &syncBuffer{}
	c, err := New(ctx, cfg, testLogger(t, log))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, log
}

// enteredConsumer starts a NATS server and a consumer on it that has
// looked its stream up (enterStream), as Run does before a session.
func enteredConsumer(t testing.TB, ctx context.Context) (jetstream.JetStream, Config, *Consumer) {
	t.Helper()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	c := newConsumer(t, ctx, cfg)
	if err := c.enterStream(ctx, false); err != nil {
		t.Fatal(err)
	}
	return js, cfg, c
}

// publish publishes n messages numbered offset..offset+n-1 over the given
// number of subjects: message g goes to in.<stream>.s<g%subjects> with body
// "<g>", Nats-Msg-Id "m<g>" and a traceparent header.
func publish(t testing.TB, ctx context.Context, js jetstream.JetStream, cfg Config, n, subjects, offset int) {
	t.Helper()
	for g := offset; g < offset+n; g++ {
		m := &nats.Msg{
			Subject: subjectOf(cfg, g, subjects),
			Data:    strconv.AppendInt(nil, int64(g), 10),
			Header:  nats.Header{},
		}
		m.Header.Set(HeaderMsgID, "m"+strconv.Itoa(g))
		m.Header.Set("traceparent", traceparent)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", g, err)
		}
		if (g-offset)%1000 == 999 || g == offset+n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatalf("publish: %d acks missing: %v", js.PublishAsyncPending(), ctx.Err())
			}
		}
	}
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// subjectOf is the subject message g is published on.
func subjectOf(cfg Config, g, subjects int) string {
	return strings.TrimSuffix(cfg.Subjects[0], ">") + "s" + strconv.Itoa(g%subjects)
}

// bodyIndex parses the body publish wrote.
func bodyIndex(t testing.TB, ev *pipeline.Event) int {
	t.Helper()
	g, err := strconv.Atoi(string(ev.Data))
	if err != nil {
		t.Fatalf("body %q of %s:%d is not a message index", ev.Data, ev.Stream, ev.StreamSeq)
	}
	return g
}

// key sends events of one subject to one ring (FNV-1a), like pipeline.Key.
func key(ev *pipeline.Event) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(ev.Subject); i++ {
		h ^= uint64(ev.Subject[i])
		h *= 1099511628211
	}
	return h
}

// got is one event as a drainer popped it from its ring.
type got struct {
	ring int
	ev   pipeline.Event
}

// runner runs Consumer.Run into a real Dispatch drained by one goroutine per
// ring; the drainers forward every event to events.
type runner struct {
	out      *ringq.Dispatch[pipeline.Event]
	events   chan got
	cancel   context.CancelFunc // intake
	done     chan error         // Run's result
	drainers sync.WaitGroup
	popErrs  atomic.Int64 // drainer errors other than ErrClosed
}

// startRun starts Run with intake derived from ctx and hard = ctx.
func startRun(t testing.TB, ctx context.Context, c *Consumer, rings, capacity, buffer int) *runner {
	t.Helper()
	r := &runner{
		out:    ringq.NewDispatch(rings, capacity, key),
		events: make(chan got, buffer),
		done:   make(chan error, 1),
	}
	intake, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	for i := 0; i < rings; i++ {
		r.drainers.Add(1)
		go func() {
			defer r.drainers.Done()
			buf := make([]pipeline.Event, 64)
			for {
				n, err := r.out.Ring(i).PopN(ctx, buf)
				for _, ev := range buf[:n] {
					select {
					case r.events <- got{ring: i, ev: ev}:
					case <-ctx.Done():
						return
					}
				}
				if err != nil {
					if !errors.Is(err, ringq.ErrClosed) {
						r.popErrs.Add(1)
					}
					return
				}
			}
		}()
	}
	go func() { r.done <- c.Run(intake, ctx, r.out) }()
	t.Cleanup(func() {
		cancel()
		r.drainers.Wait()
	})
	return r
}

// stop cancels intake and returns Run's result; the drainers have ended
// (the dispatch was closed) when it returns nil.
func (r *runner) stop(t testing.TB, ctx context.Context) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.drainers.Wait()
		return err
	case <-ctx.Done():
		t.Fatalf("Run did not return after intake was cancelled: %v", ctx.Err())
		return nil
	}
}

// stopClean is stop, failing the test unless Run returned nil.
func (r *runner) stopClean(t testing.TB, ctx context.Context) {
	t.Helper()
	if err := r.stop(t, ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// next returns the next event or fails the test at ctx's deadline.
func (r *runner) next(t testing.TB, ctx context.Context) got {
	t.Helper()
	select {
	case g := <-r.events:
		return g
	case err := <-r.done:
		t.Fatalf("Run returned early: %v", err)
	case <-ctx.Done():
		t.Fatalf("no event before the deadline: %v", ctx.Err())
	}
	return got{}
}

// ackUntil acks every event Run hands on until the one whose body is
// index (its subject's events come in order), failing the test at ctx's
// deadline.
func (r *runner) ackUntil(t testing.TB, ctx context.Context, index int) {
	t.Helper()
	for {
		g := r.next(t, ctx)
		if err := g.ev.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
		if bodyIndex(t, &g.ev) == index {
			return
		}
	}
}

// waitFor polls cond every 20ms until it holds or ctx ends.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// makeStream creates cfg's stream (its name and subjects) as an operator
// would, for a consumer that does not create it.
func makeStream(t testing.TB, ctx context.Context, js jetstream.JetStream, cfg Config) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
}

// jsFor returns a JetStream client on its own connection to srv.
func jsFor(t testing.TB, srv *testenv.NATSServer) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return js
}

// jsAt returns a JetStream client on a connection of its own to the server
// at url, closed when the test ends.
func jsAt(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return js
}

// permissionsServer starts a NATS server whose user "jetsink", the one the
// returned config connects as, may publish anything but the subjects deny
// lists; reload changes that list while the server runs (the connections
// stay). An "admin" user without limits connects js. The config is
// testConfig's (create_stream: true).
func permissionsServer(t *testing.T, ctx context.Context, deny ...string) (js jetstream.JetStream, cfg Config, reload func(deny ...string)) {
	t.Helper()
	const pass = "perm-secret"
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: pass},
			{Username: "jetsink", Password: pass, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		}
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), ServerName: "perms", Users: users(deny...)}
	srv := startServer(t, opts)
	js = jsAt(t, srv.ClientURL(), nats.UserInfo("admin", pass))
	name := uniqueName(t)
	cfg = DefaultConfig()
	cfg.URL, cfg.User, cfg.Password = srv.ClientURL(), "jetsink", pass
	cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
	cfg.CreateStream, cfg.DeadLetterSubject = true, "dlq."+name
	cfg.PullExpiry, cfg.PullHeartbeat = 2*time.Second, 500*time.Millisecond
	cfg.PullClient = cmp.Or(os.Getenv("JETSINK_TEST_PULL_CLIENT"), cfg.PullClient)
	reload = func(deny ...string) {
		t.Helper()
		o := opts.Clone()
		o.Users = users(deny...)
		if err := srv.ReloadOptions(o); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	return js, cfg, reload
}

// streamConfig is stream name's configuration as the server has it now.
func streamConfig(t testing.TB, ctx context.Context, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s.CachedInfo().Config
}

// onServerConfig is the durable consumer's configuration as the server
// has it.
func onServerConfig(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config) jetstream.ConsumerConfig {
	t.Helper()
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	return cons.CachedInfo().Config
}

// editOnServer changes the durable consumer on the server as an operator
// would (nats consumer edit).
func editOnServer(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, change func(*jetstream.ConsumerConfig)) {
	t.Helper()
	cc := onServerConfig(t, ctx, js, cfg)
	change(&cc)
	if _, err := js.UpdateConsumer(ctx, cfg.Stream, cc); err != nil {
		t.Fatal(err)
	}
}

// startFilterTestRun starts a run of a consumer with no filter (every
// subject of the stream) that looks at its durable every 100 ms, over a
// stream holding one event on each of two subjects (in.<stream>.s0 and
// .s1), after set (if not nil) has changed the consumer; it returns the
// configuration, the consumer's log, the run and JetStream. The tests of
// filters edited on the server build on it.
func startFilterTestRun(t *testing.T, ctx context.Context, set func(*Consumer)) (Config, *syncBuffer, *runner, jetstream.JetStream) {
	t.Helper()
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	c, log := newLoggedConsumer(t, ctx, cfg)
	c.floorEvery = 100 * time.Millisecond
	if set != nil {
		set(c)
	}
	js := jsFor(t, srv)
	publish(t, ctx, js, cfg, 2, 2, 0)
	return cfg, log, startRun(t, ctx, c, 1, 64, 1000), js
}

// requireUnattended fails t for each natscli command in text (by: who
// printed it) that stops to ask questions, as it does without a
// terminal ("could not ask replay policy"): a nats consumer add or nats
// stream add without --defaults, a consumer add without --replay instant;
// a nats stream edit, nats consumer edit or nats consumer rm of a named
// stream without --force; and for a --deliver that is neither a number
// nor the ack floor's stream sequence (nats consumer info prints the
// consumer sequence first). It
// returns how many such commands text holds.
func requireUnattended(t *testing.T, by, text string) int {
	t.Helper()
	for _, vague := range []string{"ack floor + 1", "ack_floor+1"} {
		if strings.Contains(text, vague) {
			t.Errorf("%s says %q, which does not say which of the floor's sequences:\n%s", by, vague, text)
		}
	}
	n := 0
	for _, verb := range []string{"nats consumer add ", "nats stream add "} {
		for rest := text; ; {
			i := strings.Index(rest, verb)
			if i < 0 {
				break
			}
			n++
			rest = rest[i+len(verb):]
			cmd := strings.TrimSpace((rest + ";")[:strings.IndexAny(rest+";", ";,()\n")])
			if !strings.HasSuffix(cmd, " --defaults") {
				t.Errorf("%s: %q does not end with --defaults:\n%s", by, verb+cmd, text)
			}
			if verb == "nats consumer add " && !strings.Contains(cmd, " --replay instant") {
				t.Errorf("%s: %q has no --replay instant:\n%s", by, verb+cmd, text)
			}
			if _, deliver, ok := strings.Cut(cmd, " --deliver "); ok {
				number := strings.TrimLeft(deliver, "0123456789")
				if number == deliver && !strings.HasPrefix(deliver, "<the ack floor's stream sequence + 1>") || number != deliver && !strings.HasPrefix(number, " ") {
					t.Errorf("%s: %q delivers from neither a number nor the ack floor's stream sequence:\n%s", by, verb+cmd, text)
				}
			}
		}
	}
	// natscli asks "Really edit Stream", "Really delete Consumer" and
	// the like unless told --force.
	for _, verb := range []string{"nats stream edit ", "nats consumer edit ", "nats consumer rm "} {
		for _, cmd := range natsCommands(text, verb) {
			if !strings.Contains(cmd+" ", " --force ") {
				t.Errorf("%s: %q has no --force:\n%s", by, cmd, text)
			}
		}
	}
	return n
}

// natsCommands is each command in text that begins with verb (as "nats
// stream edit ") and names something (verb, then a word), up to the ;
// , ( ) or newline that ends it.
func natsCommands(text, verb string) []string {
	var cmds []string
	for rest := text; ; {
		i := strings.Index(rest, verb)
		if i < 0 {
			return cmds
		}
		rest = rest[i+len(verb):]
		cmd := (rest + ";")[:strings.IndexAny(rest+";", ";,()\n")]
		if strings.TrimSpace(cmd) != "" {
			cmds = append(cmds, verb+strings.TrimSpace(cmd))
		}
	}
}

// requireQuoted fails t for each word of a natscli command in text (by:
// who printed it) that holds a $ or a & outside single quotes: a name
// (stream, consumer, subject) printed for a shell to mis-read. It returns
// how many nats commands text holds.
func requireQuoted(t *testing.T, by, text string) int {
	t.Helper()
	n := 0
	for _, verb := range []string{"nats stream ", "nats consumer "} {
		for _, cmd := range natsCommands(text, verb) {
			n++
			for _, w := range strings.Fields(cmd) {
				if strings.ContainsAny(w, "$&") && !(len(w) > 1 && strings.HasPrefix(w, "'") && strings.HasSuffix(w, "'")) {
					t.Errorf("%s: %q has %s unquoted:\n%s", by, cmd, w, text)
				}
			}
		}
	}
	return n
}
