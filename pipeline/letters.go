package pipeline

import (
	"context"
	"sync"
)

// letterLanes is how many dead letters a pipeline has under way at once,
// and laneQueue how many more each lane holds: a dead letter is a publish
// to the dead-letter stream and a wait for its PubAck (and then a term),
// one round trip to JetStream or more, so one at a time a worker stored
// 1/RTT letters a second: 200 a second over 5 ms to a replicated stream,
// while a producer sending bad events may send thousands. The events
// behind a poison event waited for its letter, without an InProgress, and
// came back after ack_wait (a duplicate row in at-least-once mode). In
// lanes, a worker hands the letter on and goes on decoding; letters of one
// subject keep their order (one lane, chosen by the subject's key), and at
// most letterLanes*(laneQueue+1) events wait for theirs.
const (
	letterLanes = 16
	laneQueue   = 32
)

// letter is a dead letter handed to a lane, with what its log line and
// counters need.
type letter struct {
	ev     Event
	dl     DeadLetter
	column string
	stats  *workerStats
}

// letterer runs the lanes of one Run.
type letterer struct {
	p     *Pipeline
	lanes [letterLanes]chan letter
	wg    sync.WaitGroup
}

// startLetters starts the lanes; each stores its letters under ctx until
// stop.
func (p *Pipeline) startLetters(ctx context.Context) *letterer {
	l := &letterer{p: p}
	for i := range l.lanes {
		ch := make(chan letter, laneQueue)
		l.lanes[i] = ch
		l.wg.Go(func() {
			for lt := range ch {
				p.deadLetter(ctx, &lt.ev, lt.dl, lt.column, lt.stats)
			}
		})
	}
	return l
}

// lane is ev's lane: the high bits of its subject's key (the low ones
// choose its worker, and would leave most lanes to other workers).
func (l *letterer) lane(ev *Event) chan<- letter {
	return l.lanes[(Key(ev)>>60)%letterLanes]
}

// stop ends the lanes once they have stored what they hold, and waits.
// Call it after every worker has returned.
func (l *letterer) stop() {
	for _, ch := range l.lanes {
		close(ch)
	}
	l.wg.Wait()
}
