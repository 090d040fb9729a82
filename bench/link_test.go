package bench

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// server runs handle on every connection to a listener of its own.
func server(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// echo answers with what it reads, and closes its side after the client
// closed its own.
func echo(c net.Conn) { _, _ = io.Copy(c, c) }

func dialLink(t *testing.T, l *link) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	return c.(*net.TCPConn)
}

// The link delays every round trip by its RTT at least, and passes every
// byte in order both ways, more at once than a direction holds (which
// stalls its reader).
func TestLinkDelaysAndKeepsTheBytes(t *testing.T) {
	const rtt = 20 * time.Millisecond
	l, err := startLink(server(t, echo), rtt, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := dialLink(t, l)
	for i := range 5 {
		start := time.Now()
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < rtt || b[0] != byte(i) {
			t.Fatalf("round trip %d: %v, got %d; want at least %v and %d", i, took, b[0], rtt, i)
		}
	}
	if mean, _ := l.Late(); mean <= 0 {
		t.Errorf("no lateness measured on chunks that waited: %v", mean)
	}

	// 4 MiB in writes of 10,000 bytes, while they come back: far more
	// than the 64 KiB a direction holds (64 KiB a half RTT, 3.2 MB/s).
	sent := make([]byte, 4<<20)
	_, _ = rand.Read(sent)
	errc := make(chan error, 1)
	go func() {
		for p := sent; len(p) > 0; {
			n, err := c.Write(p[:min(len(p), 10_000)])
			if err != nil {
				errc <- err
				return
			}
			p = p[n:]
		}
		errc <- c.CloseWrite()
	}()
	got, err := io.ReadAll(c) // ends when the server's half close comes back
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatalf("got %d bytes back, not the %d sent (or not in order)", len(got), len(sent))
	}
	if n, d := l.Stalls(); n == 0 || d <= 0 {
		t.Errorf("stalls %d (%v): 4 MiB through a link of 64 KiB each way never filled it", n, d)
	}
}

// A connection's first answer and its end come half an RTT later each way
// than on loopback: the server's greeting takes the RTT, and so does a
// half close answered by the server's.
func TestLinkDelaysConnectAndClose(t *testing.T) {
	const rtt = 30 * time.Millisecond
	l, err := startLink(server(t, func(c net.Conn) {
		if _, err := c.Write([]byte("hi")); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c)
		_ = c.(*net.TCPConn).CloseWrite()
	}), rtt, linkQueueBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	c := dialLink(t, l)
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < rtt {
		t.Errorf("greeting after %v, want the RTT (%v) at least", took, rtt)
	}
	start = time.Now()
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d bytes, %v; want the server's EOF", n, err)
	}
	if took := time.Since(start); took < rtt {
		t.Errorf("the server's close after %v, want the RTT (%v) at least", took, rtt)
	}
	if l.accepted.Load() != 1 {
		t.Errorf("%d connections, want 1", l.accepted.Load())
	}
}

// Close ends the connections through the link and its goroutines
// (testenv.Main checks that none is left); a connection made after it is
// refused.
func TestLinkClose(t *testing.T) {
	l, err := startLink(server(t, echo), 2*time.Millisecond, linkQueueBytes)
	if err != nil {
		t.Fatal(err)
	}
	c := dialLink(t, l)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a closed link: %v, want its end", err)
	}
	if c2, err := net.Dial("tcp", l.Addr()); err == nil {
		c2.Close()
		t.Fatal("a closed link accepted a connection")
	}
}

// A chunk the writer takes after its due time, because the write before it
// blocked, counts in Late as much as one it slept for: here the reader
// waits 80 ms before it reads the first chunk, so the second (due 20 ms
// after the first: not gathered into its write) goes out ~60 ms late,
// which Late must show.
func TestLinkLateCountsOverdueChunks(t *testing.T) {
	l := &link{half: time.Millisecond}
	src, srcPeer := net.Pipe()
	dst, reader := net.Pipe()
	defer srcPeer.Close()
	defer reader.Close()
	room := newByteBudget(linkQueueBytes)
	q := make(chan linkChunk, 2)
	start := time.Now()
	due := [2]time.Time{start.Add(l.half), start.Add(l.half + 20*time.Millisecond)}
	for i, d := range due {
		c := linkChunk{data: []byte{byte(i)}, due: d}
		room.take(c.size())
		q <- c
	}
	close(q)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.send(q, room, src, dst)
	}()
	defer func() { dst.Close(); <-done }()

	_ = reader.SetDeadline(time.Now().Add(time.Minute))
	time.Sleep(80 * time.Millisecond) // the slow reader: what the test is about
	var got [2]time.Time
	for i := range got {
		b := make([]byte, 1)
		if _, err := io.ReadFull(reader, b); err != nil || b[0] != byte(i) {
			t.Fatalf("read chunk %d: %v, got %d", i, err, b[0])
		}
		got[i] = time.Now()
	}
	<-done
	real := got[1].Sub(due[1])
	if real < 30*time.Millisecond {
		t.Fatalf("the second chunk came only %v after its due time: the test proves nothing", real)
	}
	if _, most := l.Late(); most < real/2 {
		t.Errorf("Late's max is %v; the second chunk went out %v late", most, real)
	}
}
