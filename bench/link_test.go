package bench

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every connection with what it reads, and closes its
// side when the client has closed its own.
func echoServer(t *testing.T) string {
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
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// The link delays every round trip by its RTT at least, passes every byte
// in order both ways, and carries a half close through after the bytes
// before it.
func TestLinkDelaysAndKeepsTheBytes(t *testing.T) {
	const rtt = 20 * time.Millisecond
	l, err := startLink(echoServer(t), rtt)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

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

	// 8 MiB, more than a direction holds, written while it is read back.
	sent := make([]byte, 8<<20)
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
		errc <- c.(*net.TCPConn).CloseWrite()
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
	if mean, most := l.Late(); mean < 0 || most < mean {
		t.Fatalf("late: mean %v, most %v", mean, most)
	}
}

// Close ends the connections through the link and its goroutines
// (testenv.Main checks that none is left); a connection made after it is
// refused.
func TestLinkClose(t *testing.T) {
	l, err := startLink(echoServer(t), 2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read a byte from a closed link")
	}
	if c2, err := net.Dial("tcp", l.Addr()); err == nil {
		c2.Close()
		t.Fatal("a closed link accepted a connection")
	}
}
