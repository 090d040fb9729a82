package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Partition is a network namespace joined to the test's by a veth pair.
// A socket made inside it (Do) reaches HostIP, the pair's outer end. Cut
// drops, without a word, every packet from the host to the namespace: what
// the socket sends still goes out (and may reach a server), but no answer
// and no acknowledgement comes back, as from a host that died or behind a
// firewall that lost the connection's state; Heal ends that. Making one
// needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip command of
// iproute2, as .ci/run has.
type Partition struct {
	HostIP string
	inIP   string     // the namespace's end of the pair
	mu     sync.Mutex // Cut and Heal
	cut    bool
	nsMu   sync.RWMutex // Do reads ns; the cleanup closes it
	ns     *os.File     // nil once closed
}

// NewPartition makes a Partition, removed in t.Cleanup. When this process
// is not root, has no ip command, or may not make a namespace and a veth
// pair (root in a container without CAP_NET_ADMIN or CAP_SYS_ADMIN), it
// skips the test, saying what the test needs, or fails it when CI is set:
// CI must run every test.
func NewPartition(t testing.TB) *Partition {
	t.Helper()
	SkipOrFail(t, partitionMissing(os.Geteuid(), ipPath()))
	SkipOrFail(t, partitionRefused())
	id := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	// A /30 in 198.18.0.0/15, the range set aside for benchmarking
	// networks (RFC 2544), which no real network should route.
	a, b := 18+rand.IntN(2), rand.IntN(256*64)*4
	p := &Partition{
		HostIP: fmt.Sprintf("198.%d.%d.%d", a, b/256, b%256+1),
		inIP:   fmt.Sprintf("198.%d.%d.%d", a, b/256, b%256+2),
	}
	name, hostIf, in := "jsk"+id, "jsk"+id+"h", "jsk"+id+"n"

	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command(ipPath(), "netns", "del", name).Run() })
	ipCmd(t, "link", "add", hostIf, "type", "veth", "peer", "name", in)
	t.Cleanup(func() { _ = exec.Command(ipPath(), "link", "del", hostIf).Run() })
	ipCmd(t, "link", "set", in, "netns", name)
	ipCmd(t, "addr", "add", p.HostIP+"/30", "dev", hostIf)
	ipCmd(t, "link", "set", hostIf, "up")
	ipCmd(t, "-n", name, "addr", "add", p.inIP+"/30", "dev", in)
	ipCmd(t, "-n", name, "link", "set", in, "up")
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	ns, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	p.ns = ns
	t.Cleanup(func() {
		// A dial may still come after the test (pgx sends a cancel
		// request from a goroutine of its own when a connection fails).
		p.nsMu.Lock()
		defer p.nsMu.Unlock()
		p.ns.Close()
		p.ns = nil
	})
	return p
}

// ipPath is the ip command of iproute2, "" when there is none. It looks in
// the sbin directories too, which a normal user's PATH (and so sudo env
// PATH=$PATH) often lacks.
var ipPath = sync.OnceValue(func() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
})

// partitionMissing says what a process with effective user ID euid and the
// ip command at ip ("" for none) lacks to make a Partition, or "" when it
// lacks nothing.
func partitionMissing(euid int, ip string) string {
	var missing []string
	if euid != 0 {
		missing = append(missing, "root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
	}
	if ip == "" {
		missing = append(missing, "the ip command of iproute2 (apt-get install iproute2)")
	}
	if len(missing) == 0 {
		return ""
	}
	return "this test cuts a connection with a network namespace and a veth pair, " +
		"which needs " + strings.Join(missing, " and ") +
		": run it as root, as .ci/run does (sudo env \"PATH=$PATH\" go test -run <test> <package>)"
}

// partitionRefused says, once per test binary, why this process, root with
// the ip command, may not make a Partition, or "" when it may: Docker gives
// a container's root neither CAP_NET_ADMIN nor CAP_SYS_ADMIN, and a
// security profile may refuse the mount that ip netns add makes. It tries,
// with a namespace and a veth pair of its own, removed at once.
var partitionRefused = sync.OnceValue(func() string {
	name := fmt.Sprintf("jsk%06x", rand.Uint32()&0xffffff)
	defer func() {
		_ = exec.Command(ipPath(), "netns", "del", name).Run()
		_ = exec.Command(ipPath(), "link", "del", name+"h").Run()
	}()
	for _, args := range [][]string{
		{"netns", "add", name},
		{"link", "add", name + "h", "type", "veth", "peer", "name", name + "n"},
	} {
		out, err := exec.Command(ipPath(), args...).CombinedOutput()
		if err == nil {
			continue
		}
		lacks := "all its capabilities"
		if caps := missingCaps(); caps != "" {
			lacks = caps
		}
		return fmt.Sprintf("this test cuts a connection with a network namespace and a veth pair, "+
			"which needs CAP_NET_ADMIN and CAP_SYS_ADMIN, and ip %s failed (%v: %s): this process is root without %s, "+
			"as in a container by default; run the container with --privileged "+
			"(or --cap-add NET_ADMIN --cap-add SYS_ADMIN, with a security profile that allows mount)",
			strings.Join(args, " "), err, strings.TrimSpace(string(out)), lacks)
	}
	return ""
})

// missingCaps names which of CAP_NET_ADMIN and CAP_SYS_ADMIN this process's
// effective set lacks ("" for neither, or when it cannot tell).
func missingCaps() string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(status)) {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		eff, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return ""
		}
		var missing []string
		for _, c := range []struct {
			bit  uint
			name string
		}{{unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"}, {unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}} {
			if eff&(1<<c.bit) == 0 {
				missing = append(missing, c.name)
			}
		}
		return strings.Join(missing, " and ")
	}
	return ""
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(ipPath(), args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s (needs the ip command of iproute2, and root)", strings.Join(args, " "), err, out)
	}
}

// Cut drops everything the host sends to the namespace until Heal, with a
// blackhole route (a link taken down instead makes the sender's own kernel
// fail its sends, which is not silence); t.Cleanup heals a partition left
// cut. A test that panics (a -timeout) leaves the namespace, the pair and
// the route behind; they are named jsk<6 hex digits> and 198.18-19.x.y
// ("ip netns del", "ip link del", "ip route del").
func (p *Partition) Cut(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	ipCmd(t, "route", "add", "blackhole", p.inIP+"/32")
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
	ipCmd(t, "route", "del", "blackhole", p.inIP+"/32")
	p.cut = false
}

// Do runs f with the calling goroutine's thread inside the namespace, so
// that the sockets f makes (a dial) belong to it; they stay there after f.
// If the thread cannot leave the namespace, Do returns an error and leaves
// the goroutine locked to it, in the namespace (the test should fail).
func (p *Partition) Do(f func() error) error {
	p.nsMu.RLock()
	defer p.nsMu.RUnlock()
	if p.ns == nil {
		return errors.New("the test's network namespace is gone")
	}
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
