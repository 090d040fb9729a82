package testenv

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Partition is a network namespace joined to the test's by a veth pair.
// A socket made inside it (Do) reaches HostIP, the pair's outer end, and
// Cut takes both ends down, so that whatever either side sends is dropped
// without an answer, as by a host that died or a firewall that lost the
// connection's state; Heal brings them up again. Making one needs root
// (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip command of iproute2, as
// .ci/run has.
type Partition struct {
	HostIP           string
	name, hostIf, in string
	ns               *os.File
	mu               sync.Mutex
	cut              bool
}

// NewPartition makes a Partition, removed in t.Cleanup.
func NewPartition(t testing.TB) *Partition {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test cuts a connection with a network namespace and a veth pair: run it as root (CAP_NET_ADMIN, CAP_SYS_ADMIN), as .ci/run does")
	}
	id := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	a, b := rand.IntN(256), rand.IntN(64)*4 // the /30 10.213.a.b
	p := &Partition{
		HostIP: fmt.Sprintf("10.213.%d.%d", a, b+1),
		name:   "jsk" + id, hostIf: "jsk" + id + "h", in: "jsk" + id + "n",
	}
	inIP := fmt.Sprintf("10.213.%d.%d", a, b+2)

	ipCmd(t, "netns", "add", p.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.name).Run() })
	ipCmd(t, "link", "add", p.hostIf, "type", "veth", "peer", "name", p.in)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", p.hostIf).Run() })
	ipCmd(t, "link", "set", p.in, "netns", p.name)
	ipCmd(t, "addr", "add", p.HostIP+"/30", "dev", p.hostIf)
	ipCmd(t, "link", "set", p.hostIf, "up")
	ipCmd(t, "-n", p.name, "addr", "add", inIP+"/30", "dev", p.in)
	ipCmd(t, "-n", p.name, "link", "set", p.in, "up")
	ipCmd(t, "-n", p.name, "link", "set", "lo", "up")
	ns, err := os.Open("/run/netns/" + p.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	p.ns = ns
	return p
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s (needs the ip command of iproute2, and root)", strings.Join(args, " "), err, out)
	}
}

// Cut drops everything between the namespace and the host until Heal;
// t.Cleanup heals a partition left cut. Taking only the host's end down
// is not enough: packets from inside still arrived (Linux 6.18).
func (p *Partition) Cut(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	ipCmd(t, "link", "set", p.hostIf, "down")
	ipCmd(t, "-n", p.name, "link", "set", p.in, "down")
	p.cut = true
	t.Cleanup(func() { p.Heal(t) })
}

// Heal ends a Cut.
func (p *Partition) Heal(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	ipCmd(t, "link", "set", p.hostIf, "up")
	ipCmd(t, "-n", p.name, "link", "set", p.in, "up")
	p.cut = false
}

// Do runs f with the calling goroutine's thread inside the namespace, so
// that the sockets f makes (a dial) belong to it; they stay there after f.
// A thread that cannot leave the namespace stays locked to the goroutine,
// and so is never used for anything else.
func (p *Partition) Do(f func() error) error {
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer home.Close()
	if err := unix.Setns(int(p.ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter the test's network namespace: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leave the test's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
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
