package pipeline

import (
	"context"
	"sync"
)

// letterLanes is how many dead letters a worker has under way at once,
// and laneQueue how many more each of its lanes holds: a dead letter is a
// publish to the dead-letter stream and a wait for its PubAck (and then a
// term), one round trip to JetStream or more, so one at a time a worker
// stored 1/RTT letters a second: 200 a second over 5 ms to a replicated
// stream, while a producer sending bad events may send thousands. The
// events behind a poison event waited for its letter, without an
// InProgress, and came back after ack_wait (a duplicate row in
// at-least-once mode). In lanes, a worker hands the letter on and goes on
// decoding; letters of one subject keep their order (one lane, chosen by
// the subject's key), so a flood of poison events on one subject is still
// stored one at a time, and the worker waits once its lane is full. Each
// worker has lanes of its own, so that one worker's flood never holds
// another; at most letterLanes*(laneQueue+1)+1 of a worker's events wait
// for their letters (the last one in the worker, waiting for room).
const (
	letterLanes = 16
	laneQueue   = 32
)

// LettersPerWorker is how many events at most wait in a worker for their
// dead letters: in its lanes, and the one it holds while it waits for
// room.
const LettersPerWorker = letterLanes*(laneQueue+1) + 1

// letter is a dead letter handed to a lane, with what its log line and
// counters need.
type letter struct {
	ev     Event
	dl     DeadLetter
	column string
	stats  *workerStats
}

// letterer is one worker's lanes.
type letterer struct {
	lanes [letterLanes]chan letter
	wg    sync.WaitGroup
}

// startLetters starts a worker's lanes; each stores its letters under ctx
// until stop. Once ctx has ended a lane hands its letters to no one: the
// process is stopping, and their events, neither stored nor settled, come
// back after ack_wait, as those in the rings do (a letter failed for the
// cancel would count and log a failure of the dead-letter stream). A
// letter already under way when ctx ends fails, and its event is nak'ed.
func (p *Pipeline) startLetters(ctx context.Context) *letterer {
	l := &letterer{}
	for i := range l.lanes {
		ch := make(chan letter, laneQueue)
		l.lanes[i] = ch
		l.wg.Go(func() {
			for lt := range ch {
				if ctx.Err() != nil {
					Release(lt.ev.Msg) // its share of the in-flight budget
					continue
				}
				p.deadLetter(ctx, &lt.ev, lt.dl, lt.column, lt.stats)
			}
		})
	}
	return l
}

// lane is ev's lane: the high bits of its subject's key (the low ones
// chose its worker, Key % workers, and with a power of two of workers are
// the same for all of a worker's subjects).
func (l *letterer) lane(ev *Event) chan<- letter {
	return l.lanes[(Key(ev)>>60)%letterLanes]
}

// stop ends the lanes once they have handed on what they hold, and waits.
// Call it after the worker has returned.
func (l *letterer) stop() {
	for _, ch := range l.lanes {
		close(ch)
	}
	l.wg.Wait()
}
