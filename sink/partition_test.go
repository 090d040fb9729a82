package sink

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/jetsink/jetsink/tests/testenv"
)

// partition is a network namespace joined to the test's by a veth pair:
// a socket made inside it (dial) reaches HostIP, the pair's outer end,
// and cut takes that end down, so that whatever the socket sends is
// dropped without an answer, as by a host that died or a firewall that
// lost the connection's state. heal brings it up again. Making one needs
// root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ip command (iproute2),
// as .ci/run has.
type partition struct {
	name, hostIf, nsIf, HostIP string
	ns                         *os.File
}

func newPartition(t *testing.T) *partition {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes a network namespace and a veth pair: run it as root (CAP_NET_ADMIN, CAP_SYS_ADMIN), as .ci/run does")
	}
	id := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	net3 := fmt.Sprintf("10.213.%d.%d", rand.IntN(256), rand.IntN(64)*4)
	p := &partition{name: "jsk" + id, hostIf: "jsk" + id + "h", HostIP: net3[:strings.LastIndexByte(net3, '.')+1]}
	last := net3[strings.LastIndexByte(net3, '.')+1:]
	var base int
	fmt.Sscan(last, &base)
	p.HostIP += fmt.Sprint(base + 1)
	nsIP := net3[:strings.LastIndexByte(net3, '.')+1] + fmt.Sprint(base+2)
	p.nsIf = "jsk" + id + "n"
	nsIf := p.nsIf

	ip(t, "netns", "add", p.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.name).Run() })
	ip(t, "link", "add", p.hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", p.hostIf).Run() })
	ip(t, "link", "set", nsIf, "netns", p.name)
	ip(t, "addr", "add", p.HostIP+"/30", "dev", p.hostIf)
	ip(t, "link", "set", p.hostIf, "up")
	ip(t, "-n", p.name, "addr", "add", nsIP+"/30", "dev", nsIf)
	ip(t, "-n", p.name, "link", "set", nsIf, "up")
	ip(t, "-n", p.name, "link", "set", "lo", "up")
	ns, err := os.Open("/run/netns/" + p.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	p.ns = ns
	return p
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s (needs the ip command of iproute2, and root)", strings.Join(args, " "), err, out)
	}
}

func (p *partition) cut(t *testing.T) {
	ip(t, "link", "set", p.hostIf, "down")
	ip(t, "-n", p.name, "link", "set", p.nsIf, "down")
}

func (p *partition) heal(t *testing.T) {
	ip(t, "link", "set", p.hostIf, "up")
	ip(t, "-n", p.name, "link", "set", p.nsIf, "up")
}

// dial wraps inner so that its sockets are made inside the namespace: the
// dialing goroutine's thread enters it for the dial and leaves it after. A
// thread that cannot leave it stays locked to the goroutine, and so is
// never used for anything else.
func (p *partition) dial(inner pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		defer home.Close()
		if err := unix.Setns(int(p.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("enter the test's network namespace: %w", err)
		}
		c, err := inner(ctx, network, addr)
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			if c != nil {
				c.Close()
			}
			return nil, fmt.Errorf("leave the test's network namespace: %w", serr)
		}
		runtime.UnlockOSThread()
		return c, err
	}
}

// A server that stops answering in the middle of a run, without closing
// the connection, costs tcp_user_timeout, not the kernel's ~15 minutes of
// retransmissions: the COPY sent into the cut path fails with a timeout,
// the batch is retried on a new connection, and once the path is back it
// commits, once.
func TestVanishedServerNoticedAfterTCPUserTimeout(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	p := newPartition(t)
	l := listenOn(t, p.HostIP+":0")
	proxied, to := l.proxy(t, pg.URL)
	l.pass(to, math.MaxInt)
	s, _ := newTestSink(t, ctx, proxied, func(c *Config) {
		c.Connections = 1
		c.TCPUserTimeout = time.Second
		c.Batch.MinDelay = 0
	})
	s.connCfg.DialFunc = p.dial(s.connCfg.DialFunc)
	src := newSource()
	wait := runSink(t, ctx, s, src)
	first, m1 := rows(1, 1, nil)
	src.push(t, ctx, first)
	waitFor(t, ctx, "the first row acked", allAcked(m1))

	p.cut(t)
	healed := false
	t.Cleanup(func() {
		if !healed {
			p.heal(t)
		}
	})
	second, m2 := rows(2, 1, nil)
	src.push(t, ctx, second)
	waitFor(t, ctx, "the COPY into the cut path to fail", func() bool { return s.Stats().Retries > 0 })
	if m2[0].acks.Load() != 0 {
		t.Fatal("the second row was acked while the path was cut")
	}
	p.heal(t)
	healed = true
	waitFor(t, ctx, "the second row acked", allAcked(m2))
	src.close()
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	admin := pg.Conn(t)
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+s.table.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		rows, _ := admin.Query(ctx, "SELECT stream_seq, xmin::text FROM "+s.table.Sanitize())
		for rows.Next() {
			var a int64
			var x string
			_ = rows.Scan(&a, &x)
			t.Logf("row %d xmin %s", a, x)
		}
		t.Logf("stats %+v", s.Stats())
		t.Fatalf("%d rows stored, want 2", n)
	}
}
