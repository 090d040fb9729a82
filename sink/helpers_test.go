package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/ringq"
	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testCols is the mapping of the tests' tables.
var testCols = []pipeline.Column{
	{Name: "stream", From: "meta:stream", Type: pipeline.TypeText, Required: true},
	{Name: "stream_seq", From: "meta:stream_seq", Type: pipeline.TypeInt8, Required: true},
	{Name: "payload", From: "payload", Type: pipeline.TypeJSONB},
}

// tuple encodes (stream text, stream_seq int8, payload jsonb) as a binary
// COPY tuple, as the pipeline's encoder does.
func tuple(stream string, seq int64, payload string) []byte {
	b := binary.BigEndian.AppendUint16(nil, 3)
	b = binary.BigEndian.AppendUint32(b, uint32(len(stream)))
	b = append(b, stream...)
	b = binary.BigEndian.AppendUint32(b, 8)
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)+1))
	b = append(b, 1) // jsonb binary format version
	return append(b, payload...)
}

// recMsg is a pipeline.Msg that records how it was settled.
type recMsg struct {
	acks, naks, inProgress, terms atomic.Int32
	// releases counts the calls of Release (pipeline.Releaser), which
	// ending the event makes (pipeline.Event.End).
	releases atomic.Int32
	failAck  bool
	// refuseInProgress is how many InProgress calls to refuse (a
	// connection refusing them) before taking any.
	refuseInProgress atomic.Int32
	// beforeAck, if set, is called as Ack starts (to hold the
	// committer that acks).
	beforeAck func()
}

func (m *recMsg) Ack() error {
	if m.beforeAck != nil {
		m.beforeAck()
	}
	m.acks.Add(1)
	if m.failAck {
		return fmt.Errorf("ack: %w", os.ErrDeadlineExceeded)
	}
	return nil
}
func (m *recMsg) Nak() error                       { m.naks.Add(1); return nil }
func (m *recMsg) NakWithDelay(time.Duration) error { m.naks.Add(1); return nil }

// InProgress is refused once the message is settled, as nats.go's is.
func (m *recMsg) InProgress() error {
	if m.acks.Load()+m.naks.Load()+m.terms.Load() > 0 {
		return errAlreadySettled
	}
	if m.refuseInProgress.Add(-1) >= 0 {
		return fmt.Errorf("in progress: %w", os.ErrDeadlineExceeded)
	}
	m.inProgress.Add(1)
	return nil
}

var errAlreadySettled = errors.New("message was already acknowledged")

func (m *recMsg) Release() { m.releases.Add(1) }

func (m *recMsg) Term() error                        { m.terms.Add(1); return nil }
func (m *recMsg) TermWithReason(reason string) error { m.terms.Add(1); return nil }

// recDL is a DeadLetterer that records the dead letters and terms the
// message, or naks it and fails when fail is set.
type recDL struct {
	mu   sync.Mutex
	got  []pipeline.DeadLetter
	seqs []uint64
	fail bool
	// delay is how long each DeadLetter takes (a slow dead-letter stream).
	delay time.Duration
	// started, if set, is called as each DeadLetter starts.
	started func(ev *pipeline.Event)
}

func (d *recDL) DeadLetter(ctx context.Context, ev *pipeline.Event, dl pipeline.DeadLetter) error {
	if d.started != nil {
		d.started(ev)
	}
	time.Sleep(d.delay)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail {
		_ = ev.Msg.NakWithDelay(time.Second)
		return fmt.Errorf("publish dead letter: %w", os.ErrDeadlineExceeded)
	}
	d.got = append(d.got, dl)
	d.seqs = append(d.seqs, ev.StreamSeq)
	return ev.Msg.TermWithReason(dl.Reason)
}

func (d *recDL) letters() ([]pipeline.DeadLetter, []uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]pipeline.DeadLetter(nil), d.got...), append([]uint64(nil), d.seqs...)
}

// rows makes n rows of stream "S" with sequences from, from+1, ..., encoded
// by a real pipeline worker (carved).
func rows(from, n int, payload func(seq int) string) ([]pipeline.Row, []*recMsg) {
	evs := make([]pipeline.Event, n)
	ms := make([]*recMsg, n)
	for i := range n {
		seq := from + i
		p := `{"n":` + fmt.Sprint(seq) + `}`
		if payload != nil {
			p = payload(seq)
		}
		ms[i] = &recMsg{}
		evs[i] = pipeline.Event{Msg: ms[i], Stream: "S", StreamSeq: uint64(seq), Subject: "events.x", Data: []byte(p)}
	}
	return carved(evs), ms
}

// firstPayload is a payload function for rows: first for seq 1, {} for the
// others.
func firstPayload(first string) func(seq int) string {
	return func(seq int) string {
		if seq == 1 {
			return first
		}
		return `{}`
	}
}

// testMapper is testCols compiled, as the processor compiles the mapping.
var testMapper = func() *pipeline.Mapper {
	m, err := pipeline.Compile(testCols)
	if err != nil {
		panic(err)
	}
	return m
}()

// carved runs evs through a pipeline worker and returns their rows in
// order. Their tuples are carved from the workers' slabs, which the sink
// gives back after settling (pipeline.ReleaseRows) and which are written
// again after that: a sink that read a tuple after its release would
// write another event's bytes, or, in race builds, a pattern PostgreSQL
// refuses. An event the worker cannot encode panics: the tests' payloads
// are all valid.
func carved(evs []pipeline.Event) []pipeline.Row {
	ctx := context.Background()
	p, err := pipeline.New(pipeline.Config{Workers: 1, Pin: pipeline.PinNone, RingSize: max(len(evs), 2),
		MaxEventBytes: pipeline.DefaultMaxEventBytes, Handoff: pipeline.HandoffRing}, testMapper, panicDL{}, nil)
	if err != nil {
		panic(err)
	}
	h := pipeline.NewHandoff(pipeline.HandoffRing, 1, max(len(evs), 1)) // room for all: push, then pop
	done := make(chan error, 1)
	go func() { done <- p.RunHandoff(ctx, h) }()
	for _, ev := range evs {
		if err := h.Push(ctx, ev); err != nil {
			panic(err)
		}
	}
	h.Close()
	out := make([]pipeline.Row, 0, len(evs))
	buf := make([]pipeline.Row, 256)
	for {
		n, err := h.PopN(ctx, buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, ringq.ErrClosed) {
			break
		}
		if err != nil {
			panic(err)
		}
	}
	if err := <-done; err != nil {
		panic(err)
	}
	if len(out) != len(evs) {
		panic(fmt.Sprintf("carved %d rows of %d events", len(out), len(evs)))
	}
	return out
}

// panicDL is the DeadLetterer of carved: every test event must encode.
type panicDL struct{}

func (panicDL) DeadLetter(_ context.Context, ev *pipeline.Event, dl pipeline.DeadLetter) error {
	panic(fmt.Sprintf("test event %d not encoded: %s", ev.StreamSeq, dl.Reason))
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// uniqueName is a table (and application) name of the test's own.
func uniqueName(t *testing.T) string {
	r := strings.NewReplacer("/", "_", " ", "_", "-", "_")
	return strings.ToLower(r.Replace(t.Name())) + fmt.Sprintf("_%d", time.Now().UnixNano()%1e6)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// captureLog sends s's log (Info and above) to the test's log and to the
// returned buffer, and has a batch that keeps failing logged again every
// stillFailing (restored when the test ends). Call it before s runs.
func captureLog(t *testing.T, s *Sink, stillFailing time.Duration) *testenv.SyncBuffer {
	t.Helper()
	prev := stillFailingEvery
	stillFailingEvery = stillFailing
	t.Cleanup(func() { stillFailingEvery = prev })
	logs := &testenv.SyncBuffer{}
	s.log = slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), nil))
	return logs
}

// withParam is dbURL with the runtime parameter key set to value for the
// sessions opened with it (e.g. lock_timeout, in ms).
func withParam(t *testing.T, dbURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// newTestSink creates a sink on url for a table of the test's own (created
// by Init unless mut turns CreateTable off).
func newTestSink(t *testing.T, ctx context.Context, url string, mut func(*Config)) (*Sink, *recDL) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.Table = uniqueName(t)
	cfg.AppName = "jetsink_" + cfg.Table
	cfg.CreateTable = true
	cfg.Retry = RetryConfig{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}
	if mut != nil {
		mut(&cfg)
	}
	dl := &recDL{}
	s, err := New(ctx, cfg, testCols, dl, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(s.Close)
	return s, dl
}

// source is a real fan-in of one ring, as the pipeline feeds the sink.
type source struct {
	*ringq.Merge[pipeline.Row]
}

func newSource() source { return source{ringq.NewMerge[pipeline.Row](1, 8192)} }

func (s source) push(t *testing.T, ctx context.Context, rs []pipeline.Row) {
	t.Helper()
	if _, err := s.Ring(0).PushN(ctx, rs); err != nil {
		t.Fatalf("push rows: %v", err)
	}
}

func (s source) close() { s.Ring(0).Close() }

// runSink runs s.Run in a goroutine; the returned function waits for it.
// A test that ends without waiting (it failed) has Run cancelled first:
// its cleanup runs before testCtx's cancel, and would otherwise wait for
// the test's deadline.
func runSink(t *testing.T, ctx context.Context, s *Sink, src Source) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, src) }()
	var once sync.Once
	var err error
	wait := func() error {
		once.Do(func() { err = <-done })
		return err
	}
	t.Cleanup(func() {
		cancel()
		_ = wait()
	})
	return wait
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func allAcked(ms []*recMsg) func() bool {
	return func() bool {
		for _, m := range ms {
			if m.acks.Load() == 0 {
				return false
			}
		}
		return true
	}
}

func count(t *testing.T, ctx context.Context, conn *pgx.Conn, table string) int {
	t.Helper()
	id, err := ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+id.Sanitize()).Scan(&n); err != nil {
		t.Fatalf("count rows: %v", err)
	}
	return n
}

// txSizes returns the number of rows of each transaction that wrote to
// table, in commit order (by xmin).
func txSizes(t *testing.T, ctx context.Context, conn *pgx.Conn, table string) []int {
	t.Helper()
	id, _ := ParseTable(table)
	rs, err := conn.Query(ctx, "SELECT count(*)::int FROM "+id.Sanitize()+" GROUP BY xmin::text::bigint ORDER BY min(stream_seq)")
	if err != nil {
		t.Fatalf("tx sizes: %v", err)
	}
	sizes, err := pgx.CollectRows(rs, pgx.RowTo[int])
	if err != nil {
		t.Fatalf("tx sizes: %v", err)
	}
	return sizes
}

// closeAndCheckTxSizes closes src, waits for Run to return nil, and checks
// the sizes of the transactions that stored table's rows (ordered by their
// first stream_seq).
func closeAndCheckTxSizes(t *testing.T, ctx context.Context, src source, wait func() error, conn *pgx.Conn, table string, want ...int) {
	t.Helper()
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := txSizes(t, ctx, conn, table); !equal(got, want) {
		t.Fatalf("transaction sizes %v, want %v", got, want)
	}
}

// waitingOnLock reports whether a backend of app waits for a lock.
func waitingOnLock(t *testing.T, ctx context.Context, conn *pgx.Conn, app string) func() bool {
	return func() bool { return backends(t, ctx, conn, app, "wait_event_type = 'Lock'") > 0 }
}

// noActiveBackend reports whether no backend of app runs a statement: a
// statement a vanished client left behind would still commit.
func noActiveBackend(t *testing.T, ctx context.Context, conn *pgx.Conn, app string) func() bool {
	return func() bool { return backends(t, ctx, conn, app, "state <> 'idle'") == 0 }
}

// backends counts the backends of app that match cond, a condition on
// pg_stat_activity; -1 after an error.
func backends(t *testing.T, ctx context.Context, conn *pgx.Conn, app, cond string) int {
	var n int
	err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND "+cond, app).Scan(&n)
	if err != nil {
		t.Errorf("pg_stat_activity: %v", err)
		return -1
	}
	return n
}

var errCanceled = context.Canceled

func testCtxCancel(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(parent)
}

func fmtAny(v any) string { return fmt.Sprintf("%v", v) }

// finishClean waits until every message of ms is acked, closes src, waits
// for Run (wait) to return nil, and checks that nothing was dead-lettered.
func finishClean(t *testing.T, ctx context.Context, src source, wait func() error, dl *recDL, ms []*recMsg) {
	t.Helper()
	waitFor(t, ctx, "rows acked", allAcked(ms))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if l, _ := dl.letters(); len(l) != 0 {
		t.Fatalf("dead letters %v", l)
	}
}

// storeClean runs s over rows 1 to n (rows) until each is acked, and
// checks that nothing was dead-lettered (finishClean).
func storeClean(t *testing.T, ctx context.Context, s *Sink, dl *recDL, n int) {
	t.Helper()
	src := newSource()
	wait := runSink(t, ctx, s, src)
	rs, ms := rows(1, n, nil)
	src.push(t, ctx, rs)
	finishClean(t, ctx, src, wait, dl, ms)
}

// listener is a test's TCP listener on 127.0.0.1. When the test ends it
// closes the listener and every connection passed to track, then waits for
// the goroutines started on wg.
type listener struct {
	net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func listen(t *testing.T) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{Listener: ln}
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

func (l *listener) track(c net.Conn) {
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
}

// verdict is what a relay does with one read's bytes.
type verdict int

const (
	pass verdict = iota // forward them
	drop                // do not forward them; go on reading
	cut                 // close the connection to the server; stop
)

// relay accepts connections on l and forwards each to the server at to,
// both ways, passing every read through the hooks that hooks makes for the
// connection: up sees what the client sends, down what the server sends.
func (l *listener) relay(to string, hooks func() (up, down func([]byte) verdict)) {
	l.relayTo(to, func(net.Conn) (up, down func([]byte) verdict) { return hooks() })
}

// relayTo is relay with hooks that get the client's connection, to answer
// it in the server's place.
func (l *listener) relayTo(to string, hooks func(client net.Conn) (up, down func([]byte) verdict)) {
	l.wg.Go(func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", to)
			if err != nil {
				client.Close()
				continue
			}
			l.track(client)
			l.track(server)
			up, down := hooks(client)
			l.wg.Go(func() { pump(server, client, down, server) })
			l.wg.Go(func() { pump(client, server, up, server) })
		}
	})
}

// pump copies from src to dst through hook until either fails or hook
// says cut, which closes server; it closes dst when it ends.
func pump(src, dst net.Conn, hook func([]byte) verdict, server net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch hook(buf[:n]) {
			case pass:
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			case cut:
				server.Close()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// tripCounter is a proxy to PostgreSQL that counts the round trips its
// clients' statements take: the Query and Sync messages they send, each
// answered by ReadyForQuery. copying counts only those that a connection
// sends after its first CopyData (a committer's, not the admin
// connection's checks).
type tripCounter struct{ n, copying atomic.Int64 }

func newTripCounter(t *testing.T, dbURL string) (*tripCounter, string) {
	t.Helper()
	l := listen(t)
	proxied, to := l.proxy(t, dbURL)
	u, err := url.Parse(proxied)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "disable") // the counter reads the messages
	u.RawQuery = q.Encode()
	proxied = u.String()
	tc := &tripCounter{}
	l.relay(to, func() (up, down func([]byte) verdict) {
		var f frontendStream
		up = func(b []byte) verdict {
			copied := f.copied
			n := f.count(b, 'Q', 'S')
			tc.n.Add(n)
			if copied {
				tc.copying.Add(n)
			}
			return pass
		}
		return up, func([]byte) verdict { return pass }
	})
	return tc, proxied
}

// frontendStream frames what a client sends to PostgreSQL: requests
// without a type byte (SSLRequest, GSSENCRequest, then the
// StartupMessage), then typed messages.
type frontendStream struct {
	started bool
	copied  bool   // a CopyData message went by
	head    []byte // the next message's start, read so far
	body    int    // bytes of the current message not read yet
}

// count reads b and returns how many messages of the given types began
// in it.
func (f *frontendStream) count(b []byte, types ...byte) (n int64) {
	for _, t := range f.types(b) {
		if bytes.IndexByte(types, t) >= 0 {
			n++
		}
	}
	return n
}

// types reads b and returns the types of the messages that began in it.
func (f *frontendStream) types(b []byte) (ts []byte) {
	for len(b) > 0 {
		if f.body > 0 {
			k := min(f.body, len(b))
			f.body, b = f.body-k, b[k:]
			continue
		}
		need := 5 // type, length
		if !f.started {
			need = 8 // length, request code
		}
		k := min(need-len(f.head), len(b))
		f.head, b = append(f.head, b[:k]...), b[k:]
		if len(f.head) < need {
			break
		}
		if f.started {
			ts = append(ts, f.head[0])
			f.copied = f.copied || f.head[0] == 'd'
			f.body = int(binary.BigEndian.Uint32(f.head[1:])) - 4
		} else {
			const sslRequest, gssRequest = 80877103, 80877104
			code := binary.BigEndian.Uint32(f.head[4:])
			f.started = code != sslRequest && code != gssRequest
			f.body = int(binary.BigEndian.Uint32(f.head)) - 8
		}
		f.head = f.head[:0]
	}
	return ts
}

// proxy returns dbURL with its host replaced by l's address, and the host
// it had.
func (l *listener) proxy(t *testing.T, dbURL string) (proxied, target string) {
	t.Helper()
	return withHost(t, dbURL, l.Addr().String())
}

// withHost returns dbURL with its host:port replaced by host, and the one
// it had.
func withHost(t *testing.T, dbURL, host string) (string, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	old := u.Host
	u.Host = host
	return u.String(), old
}

// newEpochSink is newTestSink with consumer epochs set (SetEpochs), for a
// test to advance.
func newEpochSink(t *testing.T, ctx context.Context, url string, mod func(*Config)) (*Sink, *pipeline.Epochs) {
	t.Helper()
	s, _ := newTestSink(t, ctx, url, mod)
	epochs := &pipeline.Epochs{}
	s.SetEpochs(epochs)
	return s, epochs
}

// newRole creates a login role of the test's own and runs grants on
// admin, each a statement with %[1]s for the role's name. It returns the
// role's name and pgURL with its credentials. The role, and what it owns,
// are dropped when the test ends.
func newRole(t *testing.T, ctx context.Context, admin *pgx.Conn, pgURL string, grants ...string) (string, string) {
	t.Helper()
	role := uniqueName(t)
	for _, q := range append([]string{"CREATE ROLE %[1]s LOGIN PASSWORD 'role-pw'"}, grants...) {
		if _, err := admin.Exec(ctx, fmt.Sprintf(q, role)); err != nil {
			t.Fatalf("%s: %v", fmt.Sprintf(q, role), err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "role-pw")
	return role, u.String()
}
