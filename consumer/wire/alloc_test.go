package wire

import (
	"bufio"
	"io"
	"slices"
	"strings"
	"testing"

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

// With Options.Settle the settlements go through it, with the payloads the
// connection would have written, plain ones without allocating, and they
// still do once the connection is closed.
func TestSettleThroughOptions(t *testing.T) {
	var got []string
	record := false
	settle := func(subject string, payload []byte) error {
		if record {
			got = append(got, subject+" "+string(payload))
		}
		return nil
	}
	c := &Conn{kick: make(chan struct{}, 1), done: make(chan struct{}), bw: bufio.NewWriterSize(io.Discard, readBufSize)}
	c.id = registerConn(c, settle)
	defer registry.Delete(c.id)
	m, buf := newMsg(len("s") + len("$JS.ACK.x"))
	copy(buf, "s$JS.ACK.x")
	m.subj, m.reply, m.conn = 1, uint32(len("$JS.ACK.x")), c.id
	if n := testing.AllocsPerRun(100, func() {
		m.state.Store(settleNone)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Ack through Settle: %v allocations, want 0", n)
	}
	record = true
	unregisterConn(c.id) // as Close does
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
