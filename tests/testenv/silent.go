package testenv

import (
	"net"
	"testing"
)

// SilentServer listens on a loopback port and holds each connection open
// without a word, as a hung server (or collector) does. It returns the
// address and a channel told of each connection (it drops the news of
// more than 16 not yet read); all is closed when the test ends.
func SilentServer(t testing.TB) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 16)
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done // conns is the accept goroutine's until then
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String(), accepted
}
