package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"
)

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
