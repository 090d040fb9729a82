package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pipeDialer connects every Dial to serve over net.Pipe: what serve writes
// in one Write the reader gets in one read, which TCP does not promise.
// The test waits for serve when it ends.
func pipeDialer(t *testing.T, serve func(net.Conn)) dialFunc {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	return dialFunc(func(string, string) (net.Conn, error) {
		client, server := net.Pipe()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer server.Close()
			serve(server)
		}()
		return client, nil
	})
}

// dialFunc is a function as an Options.Dialer.
type dialFunc func(network, address string) (net.Conn, error)

func (f dialFunc) Dial(network, address string) (net.Conn, error) { return f(network, address) }

// writeMsgs appends messages from to to (data "m<i>", a $JS.ACK reply,
// an empty header block) for the Sub at inbox, sid.
func writeMsgs(b *bytes.Buffer, inbox, sid string, from, to int) {
	const hdr = "NATS/1.0\r\n\r\n"
	for i := from; i <= to; i++ {
		data := "m" + strconv.Itoa(i)
		fmt.Fprintf(b, "HMSG %s %s $JS.ACK.S.C.1.%d.%d.0.0 %d %d\r\n%s%s\r\n", inbox, sid, i, i, len(hdr), len(hdr)+len(data), hdr, data)
	}
}

// blockFirst is a handler that waits for release on the first message and
// sends the data of every message to got, in order.
func blockFirst(release <-chan struct{}, got chan<- string) func(*Msg) {
	first := true
	return func(m *Msg) {
		if first {
			first = false
			<-release
		}
		got <- string(m.Data())
	}
}

// collect waits for n messages on got.
func collect(t *testing.T, got <-chan string, n int, d time.Duration) []string {
	t.Helper()
	var out []string
	timeout := time.After(d)
	for len(out) < n {
		select {
		case m := <-got:
			out = append(out, m)
		case <-timeout:
			t.Fatalf("got %q, want %d messages within %v", out, n, d)
		}
	}
	return out
}

// The connection fails while its reader still has messages to parse from
// one read: the Sub hands them on too, not only those in its buffer when
// it looked. Before, it ended as soon as its buffer was empty for a
// moment, and the reader then put the rest where nobody took them, or
// dropped them once the Sub had left: each waited ack_wait for
// redelivery and spent a delivery toward max_deliver.
//
// The reader is held between the two halves of one read by the
// connection's lock, which it needs to answer the PING between them.
func TestFailedConnectionHandsOnWhatItsReaderHadRead(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	pulled, burst := make(chan struct{}), make(chan struct{})
	serve := fakeServe(pullInfo, pullScript(func(w io.Writer, inbox, sid string, n int, _ string) {
		if n != 1 {
			return
		}
		close(pulled)
		select {
		case <-burst:
		case <-ctx.Done():
			return
		}
		var b bytes.Buffer
		writeMsgs(&b, inbox, sid, 1, 3)
		b.WriteString("PING\r\n")
		writeMsgs(&b, inbox, sid, 4, 6)
		_, _ = w.Write(b.Bytes()) // one write, one read
	}))
	c, err := Dial(ctx, Options{URL: "nats://pipe", Dialer: pipeDialer(t, serve), Settle: func(string, []byte) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	release, got := make(chan struct{}), make(chan string, 10)
	// 20 requested: handling 3 leaves 17, above the threshold, so the
	// delivery goroutine writes no pull (which would want the lock).
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 20}, blockFirst(release, got), nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-pulled: // the pull is written: nothing holds the lock
	case <-ctx.Done():
		t.Fatal("no pull came")
	}
	c.mu.Lock()
	locked := true
	defer func() {
		if locked {
			c.mu.Unlock()
		}
	}()
	close(burst)
	// m1 in the handler, m2 and m3 in the buffer: the reader is at the PING
	// or on its way there, and can go no further.
	eventually(t, 10*time.Second, "m2 and m3 buffered", func() bool { return len(sub.ch) == 2 })
	aborted := make(chan struct{})
	go func() { c.Abort(); close(aborted) }()
	<-c.Done()
	close(release)
	if m := collect(t, got, 3, 10*time.Second); !slices.Equal(m, []string{"m1", "m2", "m3"}) {
		t.Fatalf("handed on %q first, want m1 m2 m3", m)
	}
	// Before the fix the Sub now left at once (quit), with m4-m6 still to
	// be parsed; fixed, it waits for the reader, parked in handOnHeld.
	// The reader goes on only once the Sub has done one or the other, so
	// the old leaving fails the test below however slow the machine.
	eventually(t, 10*time.Second, "the Sub to leave or wait for the reader", func() bool {
		select {
		case <-sub.quit:
			return true
		default:
			return waitsForReader()
		}
	})
	c.mu.Unlock()
	locked = false
	waitClosed(t, sub, 10*time.Second)
	<-aborted
	if !errors.Is(sub.Err(), ErrConnectionClosed) {
		t.Errorf("Sub ended with %v, want ErrConnectionClosed", sub.Err())
	}
	close(got)
	var rest []string
	for m := range got {
		rest = append(rest, m)
	}
	if !slices.Equal(rest, []string{"m4", "m5", "m6"}) {
		t.Errorf("handed on %q after m3, want m4 m5 m6", rest)
	}
}

// Close after the connection failed must not undo the failure's promise:
// a Sub that had not looked yet still hands on what it holds. Before,
// Close marked the connection closed by Close whatever had ended it, and
// such a Sub dropped its messages.
func TestCloseAfterAFailureLeavesSubsHandingOn(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	url := pullServer(t, func(w io.Writer, inbox, sid string, n int, _ string) {
		if n == 1 {
			var b bytes.Buffer
			writeMsgs(&b, inbox, sid, 1, 4)
			_, _ = w.Write(b.Bytes())
		}
	})
	c, err := Dial(ctx, Options{URL: url, Settle: func(string, []byte) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	release, got := make(chan struct{}), make(chan string, 10)
	sub, err := c.Consume(PullOptions{Stream: "S", Consumer: "C", MaxMessages: 20}, blockFirst(release, got), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Closed() })
	eventually(t, 10*time.Second, "m2-m4 buffered", func() bool { return len(sub.ch) == 3 })
	c.Abort()
	if err := c.Close(); err != nil {
		t.Errorf("Close after Abort: %v", err)
	}
	close(release)
	waitClosed(t, sub, 10*time.Second)
	if m := collect(t, got, 4, time.Second); !slices.Equal(m, []string{"m1", "m2", "m3", "m4"}) {
		t.Errorf("handed on %q, want m1-m4", m)
	}
	if !errors.Is(sub.Err(), ErrConnectionClosed) {
		t.Errorf("Sub ended with %v, want ErrConnectionClosed", sub.Err())
	}
}

// waitsForReader reports whether a Sub's delivery goroutine is parked in
// handOnHeld's wait for the reader (the one select there that blocks).
func waitsForReader() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "wire.(*Sub).handOnHeld(") {
			return true
		}
	}
	return false
}
