package sink

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// canWatch: Linux's TCP_INFO says when the server's host last answered.
const canWatch = true

// silentFor reports whether the connection behind rc has had no sign of
// life from the other host for d (see silent), counting from at most
// watched ago: before the watch began the connection may have been idle,
// and the time since its last acknowledgement then says nothing about the
// data just sent. False when TCP_INFO cannot be read.
func silentFor(rc syscall.RawConn, d, watched time.Duration) bool {
	info, err := tcpInfo(rc)
	if err != nil {
		return false
	}
	quiet := min(time.Duration(info.Last_ack_recv)*time.Millisecond, watched)
	return silent(info.Unacked, info.Probes, quiet, d)
}

// tcpInfo reads the kernel's TCP_INFO for the socket behind rc.
func tcpInfo(rc syscall.RawConn) (*unix.TCPInfo, error) {
	var info *unix.TCPInfo
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return nil, err
	}
	return info, gerr
}

// silent is the rule: no acknowledgement for quiet >= d while data is
// unacknowledged (unacked segments) or while probes go unanswered (probes:
// keepalive or zero-window probes sent since the last answer). A host that
// is alive answers every probe, which resets probes to 0, even when its
// receive window is closed (measured: probes stayed 0 through 40 s of a
// closed window, answered probes backing off to 13 s apart); one probe may
// be on its way when the watch looks, so it takes two.
func silent(unacked uint32, probes uint8, quiet, d time.Duration) bool {
	return (unacked > 0 || probes >= 2) && quiet >= d
}
