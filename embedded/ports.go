package embedded

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a loopback TCP port free at the moment, below the range
// the kernel takes the source ports of outgoing connections from (and the
// port of a listener on port 0): NATSServer.Restart and Cluster.Start bind
// the port again after a pause in which any connection opened on the
// machine could otherwise take it, failing the restart (tests that bind a
// port they picked use it too). It falls back to a port the kernel picks,
// and returns an error only when no port can be bound at all.
func FreePort() (int, error) {
	if low := ephemeralLow(); low > 2048 {
		// The 16,384 ports below the range (all of them above 1,023).
		base := max(1024, low-16384)
		for range 32 {
			p := base + rand.IntN(low-base)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				_ = l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of net.ipv4.ip_local_port_range; 0 when
// it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	low, _ := strconv.Atoi(f[0])
	return low
}
