package wire

import (
	"bufio"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetsink/jetsink/pipeline"
)

// *Msg is what jetsink's later stages settle.
var _ pipeline.Msg = (*Msg)(nil)

// repeatReader serves the same bytes for ever.
type repeatReader struct {
	b   []byte
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

// TestHotPathAllocations pins the package's promise: one allocation per
// delivered message, none to read it or to settle it.
func TestHotPathAllocations(t *testing.T) {
	wire := protoStream[4].wire // an HMSG with a reply and two headers
	p := parser{br: bufio.NewReaderSize(&repeatReader{b: []byte(wire)}, readBufSize), maxPayload: 1 << 20}
	var f frame
	if n := testing.AllocsPerRun(1000, func() {
		if err := p.next(&f); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("parsing a message: %v allocations, want 1", n)
	}
	m := f.msg
	if n := testing.AllocsPerRun(1000, func() {
		if m.Subject() == "" || m.Reply() == "" || len(m.Data()) == 0 || m.HeaderGet("traceparent") == "" || m.HeaderGet("Missing") != "" || m.HeaderFold("TRACEPARENT") == "" || m.HeaderFold("missing") != "" {
			t.Fatal("accessors")
		}
		if _, ok := m.HeaderLookup("Nats-Msg-Id"); !ok {
			t.Fatal("accessors")
		}
	}); n != 0 {
		t.Errorf("reading a message: %v allocations, want 0", n)
	}
	c := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(io.Discard, readBufSize)}
	c.id = registerConn(c, nil)
	defer registry.Delete(c.id)
	m.conn = c.id
	for name, settle := range map[string]func() error{
		"Ack": m.Ack, "Nak": m.Nak, "Term": m.Term,
		"NakWithDelay":   func() error { return m.NakWithDelay(1234567) },
		"TermWithReason": func() error { return m.TermWithReason("why") },
	} {
		if n := testing.AllocsPerRun(1000, func() {
			m.state.Store(settleNone)
			if err := settle(); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
	var out strings.Builder
	c.bw.Reset(&out)
	m.state.Store(settleNone)
	_ = m.NakWithDelay(1500)
	_ = m.InProgress()
	m.state.Store(settleNone)
	_ = m.TermWithReason("bad payload")
	_ = c.bw.Flush()
	want := "PUB $JS.ACK.x 19\r\n-NAK {\"delay\":1500}\r\nPUB $JS.ACK.x 17\r\n+TERM bad payload\r\n"
	if out.String() != want {
		t.Errorf("wrote\n%q\nwant\n%q", out.String(), want)
	}
}

// With Options.Settle, the settlements of an open connection's messages
// still go over it; once it is closed they go through Settle, with the
// payloads the connection would have written, plain ones without
// allocating.
func TestSettleThroughOptions(t *testing.T) {
	var got []string
	record := false
	settle := func(subject string, payload []byte) error {
		if record {
			got = append(got, subject+" "+string(payload))
		}
		return nil
	}
	var out strings.Builder
	c := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(&out, readBufSize)}
	c.id = registerConn(c, settle)
	defer registry.Delete(c.id)
	m, buf := newMsg(len("s") + len("$JS.ACK.x"))
	copy(buf, "s$JS.ACK.x")
	m.subj, m.reply, m.conn = 1, uint32(len("$JS.ACK.x")), c.id
	record = true
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	_ = c.bw.Flush()
	if want := "PUB $JS.ACK.x 4\r\n+ACK\r\n"; out.String() != want || len(got) != 0 {
		t.Errorf("open connection: wrote %q and settled %q through Settle; want %q and nothing", out.String(), got, want)
	}
	record = false
	unregisterConn(c.id) // as Close does
	if n := testing.AllocsPerRun(100, func() {
		m.state.Store(settleNone)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Ack through Settle: %v allocations, want 0", n)
	}
	record = true
	for _, f := range []func() error{m.InProgress, m.Ack} {
		m.state.Store(settleNone)
		if err := f(); err != nil {
			t.Fatalf("after close: %v", err)
		}
	}
	for _, f := range []func() error{m.Nak, m.Term, func() error { return m.NakWithDelay(1500) }, func() error { return m.TermWithReason("bad payload") }} {
		m.state.Store(settleNone)
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"$JS.ACK.x +WPI", "$JS.ACK.x +ACK", "$JS.ACK.x -NAK", "$JS.ACK.x +TERM",
		`$JS.ACK.x -NAK {"delay":1500}`, "$JS.ACK.x +TERM bad payload"}
	if !slices.Equal(got, want) {
		t.Errorf("settled\n%q\nwant\n%q", got, want)
	}
}

// otherMsg is a pipeline.Msg that is not a *Msg: AckAll calls its Ack.
type otherMsg struct{ acks int }

func (o *otherMsg) Ack() error                       { o.acks++; return nil }
func (o *otherMsg) Nak() error                       { return nil }
func (o *otherMsg) NakWithDelay(time.Duration) error { return nil }
func (o *otherMsg) InProgress() error                { return nil }
func (o *otherMsg) Term() error                      { return nil }
func (o *otherMsg) TermWithReason(string) error      { return nil }

// testMsg is a message with reply subject reply (none when "") delivered
// by the connection with registry id conn.
func testMsg(conn uint64, reply string) *Msg {
	m, buf := newMsg(1 + len(reply))
	copy(buf, "s"+reply)
	m.subj, m.reply, m.conn = 1, uint32(len(reply)), conn
	return m
}

// AckAll writes the +ACKs of one open connection's messages into its
// buffer, as Ack would and without allocating; a message it cannot ack
// gets Ack's error, a closed connection's messages go through
// Options.Settle, and any other pipeline.Msg gets its own Ack.
func TestAckAll(t *testing.T) {
	var settled []string
	open := func(settle func(string, []byte) error) (*Conn, *strings.Builder) {
		var out strings.Builder
		c := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(&out, readBufSize)}
		c.id = registerConn(c, settle)
		t.Cleanup(func() { registry.Delete(c.id) })
		return c, &out
	}
	record := func(subject string, payload []byte) error {
		settled = append(settled, subject+" "+string(payload))
		return nil
	}
	a, aOut := open(record)
	b, bOut := open(nil)
	gone, _ := open(record)
	unregisterConn(gone.id) // as Close does
	goneNoSettle, _ := open(nil)
	unregisterConn(goneNoSettle.id)

	acked := testMsg(a.id, "$JS.ACK.a.3")
	acked.state.Store(settleFinal)
	other := &otherMsg{}
	ms := []pipeline.Msg{
		testMsg(a.id, "$JS.ACK.a.1"), testMsg(a.id, "$JS.ACK.a.2"),
		acked, testMsg(a.id, ""), other,
		testMsg(b.id, "$JS.ACK.b.1"), testMsg(a.id, "$JS.ACK.a.4"),
		testMsg(gone.id, "$JS.ACK.gone.1"), testMsg(goneNoSettle.id, "$JS.ACK.none.1"),
		testMsg(a.id, "$JS.ACK.a.5"),
	}
	errs := make([]error, len(ms))
	AckAll(ms, errs)
	wantErrs := []error{nil, nil, ErrMsgAlreadyAcked, ErrMsgNoReply, nil, nil, nil, nil, ErrConnectionClosed, nil}
	for i := range ms {
		if !errors.Is(errs[i], wantErrs[i]) || (wantErrs[i] == nil && errs[i] != nil) {
			t.Errorf("message %d: %v, want %v", i, errs[i], wantErrs[i])
		}
	}
	_, _ = a.bw.Flush(), b.bw.Flush()
	if want := "PUB $JS.ACK.a.1 4\r\n+ACK\r\nPUB $JS.ACK.a.2 4\r\n+ACK\r\nPUB $JS.ACK.a.4 4\r\n+ACK\r\nPUB $JS.ACK.a.5 4\r\n+ACK\r\n"; aOut.String() != want {
		t.Errorf("connection a got\n%q\nwant\n%q", aOut.String(), want)
	}
	if want := "PUB $JS.ACK.b.1 4\r\n+ACK\r\n"; bOut.String() != want {
		t.Errorf("connection b got\n%q\nwant\n%q", bOut.String(), want)
	}
	if want := []string{"$JS.ACK.gone.1 +ACK"}; !slices.Equal(settled, want) {
		t.Errorf("through Settle: %q, want %q", settled, want)
	}
	if other.acks != 1 {
		t.Errorf("the other Msg was acked %d times, want 1", other.acks)
	}
	// Acked once: a second AckAll acks nothing.
	AckAll(ms, errs)
	if !errors.Is(errs[0], ErrMsgAlreadyAcked) || !errors.Is(errs[5], ErrMsgAlreadyAcked) || !errors.Is(errs[7], ErrMsgAlreadyAcked) {
		t.Errorf("second AckAll: %v", errs)
	}
	// A message that could not be acked can be again.
	if errs[8] == nil || ms[8].(*Msg).state.Load() != settleNone {
		t.Errorf("the closed connection's message: %v, state %d; want an error and settleNone", errs[8], ms[8].(*Msg).state.Load())
	}

	batch := make([]pipeline.Msg, 1000)
	for i := range batch {
		batch[i] = testMsg(a.id, "$JS.ACK.STREAM.jetsink.1.1000000.1000000.1764658000000000000.0")
	}
	errs = make([]error, len(batch))
	a.bw.Reset(io.Discard)
	if n := testing.AllocsPerRun(10, func() {
		for _, m := range batch {
			m.(*Msg).state.Store(settleNone)
		}
		AckAll(batch, errs)
	}); n != 0 {
		t.Errorf("AckAll of 1,000 messages: %v allocations, want 0", n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batch message %d: %v", i, err)
		}
	}
}

// failingWriter refuses every write.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// A connection closed but still registered (its flusher failed, or Close
// is under way) takes no ack: AckAll sends them through Options.Settle.
// When the buffer cannot be written out in the middle of AckAll, the
// connection fails and that message and the rest go through Settle too,
// none reported acked without having been buffered.
func TestAckAllClosedOrFailingConnection(t *testing.T) {
	var settled []string
	record := func(subject string, payload []byte) error {
		settled = append(settled, subject)
		return nil
	}
	closing := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(io.Discard, readBufSize)}
	closing.id = registerConn(closing, record)
	t.Cleanup(func() { registry.Delete(closing.id) })
	closing.closed.Store(true)
	closing.err = ErrConnectionClosed
	close(closing.done)
	ms := []pipeline.Msg{testMsg(closing.id, "$JS.ACK.c.1"), testMsg(closing.id, "$JS.ACK.c.2")}
	errs := make([]error, len(ms))
	AckAll(ms, errs)
	if errs[0] != nil || errs[1] != nil || !slices.Equal(settled, []string{"$JS.ACK.c.1", "$JS.ACK.c.2"}) {
		t.Errorf("closed connection: errors %v, through Settle %q", errs, settled)
	}

	settled = nil
	client, server := net.Pipe()
	t.Cleanup(func() { _ = server.Close() })
	// Room for two acks of these 32-byte reply subjects (44 bytes each).
	failing := &Conn{nc: client, kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(failingWriter{}, 100)}
	failing.id = registerConn(failing, record)
	t.Cleanup(func() { registry.Delete(failing.id) })
	ms = ms[:0]
	for i := range 5 {
		ms = append(ms, testMsg(failing.id, "$JS.ACK.failing.0123456789abcd."+strconv.Itoa(i)))
	}
	errs = make([]error, len(ms))
	AckAll(ms, errs)
	for i, err := range errs {
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if want := []string{"$JS.ACK.failing.0123456789abcd.2", "$JS.ACK.failing.0123456789abcd.3", "$JS.ACK.failing.0123456789abcd.4"}; !slices.Equal(settled, want) {
		t.Errorf("through Settle %q, want %q: the acks after the failed write", settled, want)
	}
	select {
	case <-failing.Done():
		if !errors.Is(failing.Err(), io.ErrClosedPipe) {
			t.Errorf("connection failed with %v, want the write error", failing.Err())
		}
	default:
		t.Error("the connection did not fail")
	}
}

// A settlement whose write fails fails the connection and goes through
// Options.Settle, not reported sent and dropped.
func TestSettleFailingWrite(t *testing.T) {
	var settled []string
	client, server := net.Pipe()
	t.Cleanup(func() { _ = server.Close() })
	c := &Conn{nc: client, kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(failingWriter{}, 16)}
	c.id = registerConn(c, func(subject string, payload []byte) error {
		settled = append(settled, subject+" "+string(payload))
		return nil
	})
	t.Cleanup(func() { registry.Delete(c.id) })
	m := testMsg(c.id, "$JS.ACK.failing.1")
	if err := m.NakWithDelay(1500); err != nil {
		t.Fatal(err)
	}
	if want := []string{`$JS.ACK.failing.1 -NAK {"delay":1500}`}; !slices.Equal(settled, want) {
		t.Errorf("through Settle %q, want %q", settled, want)
	}
	if !errors.Is(c.Err(), io.ErrClosedPipe) {
		t.Errorf("connection: %v, want failed with the write error", c.Err())
	}
}

// A closed connection's entry, kept for Options.Settle, goes once it has
// been closed for closedRefTTL (at the next close): a connection that
// fails again and again does not grow the registry without bound. Until
// then its messages are settled through Settle; after, Ack says the
// connection is gone.
func TestClosedConnectionsExpire(t *testing.T) {
	setTTL := func(d time.Duration) time.Duration {
		closedMu.Lock()
		defer closedMu.Unlock()
		old := closedRefTTL
		closedRefTTL = d
		return old
	}
	defer setTTL(setTTL(50 * time.Millisecond))
	settled := 0
	settle := func(string, []byte) error { settled++; return nil }
	open := func() *Conn {
		c := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{})}
		c.id = registerConn(c, settle)
		t.Cleanup(func() { registry.Delete(c.id) })
		return c
	}
	first := open()
	unregisterConn(first.id)
	if err := testMsg(first.id, "$JS.ACK.first.1").Ack(); err != nil || settled != 1 {
		t.Fatalf("just closed: Ack = %v, %d settled through Settle; want nil, 1", err, settled)
	}
	time.Sleep(100 * time.Millisecond)
	ids := make([]uint64, 1000)
	for i := range ids {
		ids[i] = open().id
		unregisterConn(ids[i])
	}
	if ref := lookupConn(first.id); ref != nil {
		t.Fatal("an entry closed longer than closedRefTTL ago is still in the registry")
	}
	if err := testMsg(first.id, "$JS.ACK.first.2").Ack(); !errors.Is(err, ErrConnectionClosed) || settled != 1 {
		t.Fatalf("expired: Ack = %v, %d settled; want ErrConnectionClosed, 1", err, settled)
	}
	// The 1000 go at the next close after closedRefTTL.
	time.Sleep(100 * time.Millisecond)
	last := open()
	unregisterConn(last.id)
	for _, id := range ids {
		if lookupConn(id) != nil {
			t.Fatalf("connection %d closed longer than closedRefTTL ago is still in the registry", id)
		}
	}
	if lookupConn(last.id) == nil {
		t.Fatal("the connection closed last is not in the registry")
	}
}
