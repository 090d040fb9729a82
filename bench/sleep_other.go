//go:build !linux

package bench

import "time"

// sleepUntil sleeps until t. Off Linux it is Go's timer, which may round
// a short wait up to a millisecond or so while the process is otherwise
// idle: a --postgres-rtt or --nats-rtt of a few milliseconds is then
// coarser than on Linux.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
