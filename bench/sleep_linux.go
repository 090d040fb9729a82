package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepUntil sleeps until t with nanosleep: a Go timer would round the
// wait up to a whole millisecond while the process is otherwise idle.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(int64(d))
		_ = unix.Nanosleep(&ts, nil) // EINTR: sleep what is left
	}
}
