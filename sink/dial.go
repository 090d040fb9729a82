package sink

import (
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"
)

// dialFunc returns the DialFunc of every connection the sink opens (the
// committers', the admin connection, cancel requests). TCP connections get
// Go's keepalive (probes after 15s idle, every 15s) and TCP_USER_TIMEOUT of
// userTimeout: data unacknowledged, or keepalive probes unanswered, for
// that long ends the connection, so a server that vanished without closing
// it is noticed in about userTimeout instead of after the kernel's ~15
// minutes of retransmissions. 0 leaves the system's default. pgx's
// connect_timeout still bounds the connect: pgconn applies it to the
// context.
func dialFunc(userTimeout time.Duration) pgconn.DialFunc {
	d := &net.Dialer{}
	if userTimeout > 0 {
		ms := int(userTimeout / time.Millisecond)
		d.Control = func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") { // a unix socket has no TCP options
				return nil
			}
			return setUserTimeout(rc, ms)
		}
	}
	return d.DialContext
}

// setUserTimeout sets TCP_USER_TIMEOUT to ms milliseconds.
func setUserTimeout(rc syscall.RawConn, ms int) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ms)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
	}
	return nil
}
