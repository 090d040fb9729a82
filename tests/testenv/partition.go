package testenv

import (
	"io"
	"net"
	"os"
	"sync"
	"testing"
)

// SkipOrFail skips t, saying why, when missing is not "": a developer's
// make test is not root; but fails it when CI is set.
func SkipOrFail(t testing.TB, missing string) {
	t.Helper()
	if missing == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(missing + " (CI is set: CI runs every test, so this fails instead of skipping)")
	}
	t.Skip(missing)
}

// Proxy listens on addr and forwards the first n connections to target,
// both ways; each later one is held open without an answer (its connect
// hangs). Everything is closed when the test ends. It returns the address
// it listens on.
func Proxy(t testing.TB, addr, target string, n int) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			client, err := l.Accept()
			if err != nil {
				return
			}
			track(client)
			if i >= n {
				continue // held: nothing is read or answered
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			track(server)
			wg.Go(func() { _, _ = io.Copy(server, client); server.Close() })
			wg.Go(func() { _, _ = io.Copy(client, server); client.Close() })
		}
	})
	return l.Addr().String()
}
