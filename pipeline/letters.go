package pipeline

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// letterLanes is how many dead letters a worker has under way at once: a
// dead letter is a publish to the dead-letter stream and a wait for its
// PubAck (and then a term), one round trip to JetStream or more, so one at
// a time a worker stored 1/RTT letters a second: 200 a second over 5 ms to
// a replicated stream, while a producer sending bad events may send
// thousands. In lanes, a worker hands the letter on and goes on decoding;
// letters of one subject keep their order (one lane, chosen by the
// subject's key), so a flood of poison events on one subject is still
// stored one at a time. Each worker has lanes of its own, so that one
// worker's flood never holds another.
//
// A lane's queue has no bound of its own: the letters waiting in it hold
// their share of the consumer's in-flight budget (nats.max_in_flight_bytes,
// nats.max_ack_pending) until they are stored, and that budget is what
// bounds them, as it bounds the rows the sink holds while the database
// stalls. The worker waits only when its letters reach the limit set with
// SetLetterLimit (DefaultLetterLimit without one). Waiting letters get
// InProgress (SetHeartbeat) as the sink's rows do, so that a dead-letter
// stream that answers slowly does not leave them, or the rows behind
// them, past ack_wait.
const letterLanes = 16

// DefaultLetterLimit is how many dead letters a worker's lanes hold
// before it waits, unless SetLetterLimit says otherwise.
const DefaultLetterLimit = 512

// LettersPerWorker is how many events at most wait in a worker for their
// dead letters under DefaultLetterLimit: in its lanes, one under way in
// each, and the one it holds while it waits for room.
const LettersPerWorker = DefaultLetterLimit + letterLanes + 1

// letter is a dead letter handed to a lane, with what its log line and
// counters need.
type letter struct {
	ev     Event
	dl     DeadLetter
	column string
	stats  *workerStats
	due    time.Time // when the heartbeat next sends it InProgress
}

// lane is a FIFO of letters and the goroutine that stores them.
type lane struct {
	mu     sync.Mutex
	q      []letter // waiting: q[head:], oldest first
	head   int
	taken  uint64 // letters taken so far: q[head] is letter number taken
	closed bool
	wake   chan struct{} // 1 deep: a letter was put, or the lane closed

	betweenChunks func() // tests: runs where beat has let the lock go
}

// beatChunk is how many letters beat sends InProgress to under one hold of
// the lane's lock: the worker's put and the lane's take wait for it.
const beatChunk = 256

// put appends lt.
func (ln *lane) put(lt letter) {
	ln.mu.Lock()
	if ln.head > 0 && ln.head >= len(ln.q)/2 {
		// Most of the slice is taken: slide the rest down rather than
		// let append grow it past what waits.
		n := copy(ln.q, ln.q[ln.head:])
		clear(ln.q[n:])
		ln.q, ln.head = ln.q[:n], 0
	}
	ln.q = append(ln.q, lt)
	ln.mu.Unlock()
	select {
	case ln.wake <- struct{}{}:
	default:
	}
}

// take removes and returns the oldest letter, waiting for one; false once
// the lane is closed and empty.
func (ln *lane) take() (letter, bool) {
	for {
		ln.mu.Lock()
		if ln.head < len(ln.q) {
			lt := ln.q[ln.head]
			ln.q[ln.head] = letter{} // its payload goes with its letter
			ln.head++
			ln.taken++
			if ln.head == len(ln.q) {
				// Empty: keep a small slice for the next letters, give a
				// flood's back.
				if cap(ln.q) > 4*DefaultLetterLimit/letterLanes {
					ln.q = nil
				}
				ln.q, ln.head = ln.q[:0], 0
			}
			ln.mu.Unlock()
			return lt, true
		}
		closed := ln.closed
		ln.mu.Unlock()
		if closed {
			return letter{}, false
		}
		<-ln.wake
	}
}

// close lets take return false once the lane is empty.
func (ln *lane) close() {
	ln.mu.Lock()
	ln.closed = true
	ln.mu.Unlock()
	select {
	case ln.wake <- struct{}{}:
	default:
	}
}

// beat sends InProgress for the lane's letters that are due (see
// letterer.heartbeat) and of the epoch epochs holds, beatChunk letters at a
// time: between chunks the lane's lock and the epoch's hold are let go, so
// that a long lane holds neither the worker nor a stream's re-creation
// (Epochs.Advance) while its InProgress are written. A letter is numbered
// by the letters taken before it (taken), which neither a take nor put's
// sliding changes.
func (ln *lane) beat(now time.Time, every time.Duration, epochs *Epochs) (sent, failed uint64, err error) {
	var next uint64 // the number of the next letter to look at
	for {
		epoch := epochs.Hold()
		ln.mu.Lock()
		next = max(next, ln.taken)
		i := ln.head + int(next-ln.taken)
		end := min(len(ln.q), i+beatChunk)
		for ; i < end; i++ {
			lt := &ln.q[i]
			// A letter taken before its stream was re-created gets none:
			// JetStream would apply it to the new stream's event with the
			// same sequence (see Epochs).
			if now.Before(lt.due) || lt.ev.Msg == nil || lt.ev.Epoch != epoch {
				continue
			}
			lt.due = now.Add(every)
			sent++
			if e := lt.ev.Msg.InProgress(); e != nil {
				failed++
				err = e
				lt.due = now.Add(every / 4) // again at the next tick
			}
		}
		next = ln.taken + uint64(i-ln.head)
		more := i < len(ln.q)
		ln.mu.Unlock()
		epochs.Release()
		if !more {
			return sent, failed, err
		}
		if ln.betweenChunks != nil {
			ln.betweenChunks()
		}
	}
}

// letterer is one worker's lanes.
type letterer struct {
	p       *Pipeline
	lanes   [letterLanes]lane
	lanesWG sync.WaitGroup
	beatWG  sync.WaitGroup
	queued  *atomic.Int64 // letters put and not yet taken (the worker's stats)
	stale   atomic.Int64  // letters of an old epoch left at a hard stop (leave)
	room    chan struct{} // 1 deep: a lane took a letter
	stop    chan struct{} // closed by close once the lanes are done: the heartbeat ends
}

// startLetters starts a worker's lanes, and their heartbeat if
// SetHeartbeat set one; each lane stores its letters under ctx until
// close. Once ctx has ended a lane hands its letters to no one: the
// process is stopping, and their events, neither stored nor settled, come
// back after ack_wait, as those in the rings do (a letter failed for the
// cancel would count and log a failure of the dead-letter stream); but an
// event whose stream was re-created since (an old epoch) is gone from
// JetStream, and close logs how many such letters were left. A letter
// already under way when ctx ends fails, and its event is nak'ed (or, of
// an old epoch, its dead-letterer logs it).
func (p *Pipeline) startLetters(ctx context.Context, stats *workerStats) *letterer {
	l := &letterer{p: p, queued: &stats.lettersWaiting, room: make(chan struct{}, 1), stop: make(chan struct{})}
	for i := range l.lanes {
		ln := &l.lanes[i]
		ln.wake = make(chan struct{}, 1)
		l.lanesWG.Go(func() {
			for {
				lt, ok := ln.take()
				if !ok {
					return
				}
				l.queued.Add(-1)
				select {
				case l.room <- struct{}{}:
				default:
				}
				if ctx.Err() != nil {
					l.leave(&lt)
					continue
				}
				p.deadLetter(ctx, &lt.ev, lt.dl, lt.column, lt.stats)
			}
		})
	}
	if p.beatEvery > 0 {
		l.beatWG.Go(func() { l.heartbeat(ctx) })
	}
	return l
}

// lane is ev's lane: the high bits of its subject's key (the low ones
// chose its worker, Key % workers, and with a power of two of workers are
// the same for all of a worker's subjects).
func (l *letterer) lane(ev *Event) *lane {
	return &l.lanes[(Key(ev)>>60)%letterLanes]
}

// limit is how many letters may wait before the worker does.
func (l *letterer) limit() int64 {
	if f := l.p.letterLimit; f != nil {
		return int64(max(f(), 1))
	}
	return DefaultLetterLimit
}

// add queues lt in its lane, unless the worker's letters are at their
// limit: then it reports false and queues nothing. Only the worker calls
// add and wait (the lanes only take away), so what add checks holds.
func (l *letterer) add(lt letter) bool {
	if l.queued.Load() >= l.limit() {
		return false
	}
	l.put(lt)
	return true
}

// wait queues lt once the worker's letters are below their limit, or
// returns ctx's error if ctx ends first.
func (l *letterer) wait(ctx context.Context, lt letter) error {
	for l.queued.Load() >= l.limit() {
		select {
		case <-l.room:
		case <-ctx.Done():
			l.leave(&lt) // as the lanes do at a hard stop
			return ctx.Err()
		}
	}
	l.put(lt)
	return nil
}

// put queues lt, its first InProgress due half of the heartbeat's period
// after JetStream delivered it: ack_wait runs from then.
func (l *letterer) put(lt letter) {
	now := time.Now()
	since := now
	// Received may have no monotonic reading (consumer/wire stamps the
	// wall clock): a clock step in between only moves the first beat.
	if rc := lt.ev.Received; !rc.IsZero() && rc.Before(now) {
		since = now.Add(-now.Sub(rc))
	}
	lt.due = since.Add(l.p.beatEvery / 2)
	l.queued.Add(1)
	l.lane(&lt.ev).put(lt)
}

// heartbeat sends InProgress for the letters waiting in the lanes once
// they are due: half of the period after JetStream delivered them, then a
// period after each beat, checking every quarter period; so a letter's
// ack wait is renewed at most 3/4 of the period after delivery and 5/4 of
// it after each beat (the period is a third of ack_wait). The letter under
// way is not beaten: it is settled (term or nak) once its publish
// returns, which the dead-letterer's own timeout bounds. It ends with ctx
// (a hard stop: the lanes then leave their letters to JetStream, which
// should deliver them again after ack_wait, not later) or once the lanes
// are done.
func (l *letterer) heartbeat(ctx context.Context) {
	every := l.p.beatEvery
	t := time.NewTicker(max(every/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		case now := <-t.C:
			if l.queued.Load() == 0 {
				continue
			}
			var sent, failed uint64
			var failure error
			for i := range l.lanes {
				s, f, err := l.lanes[i].beat(now, every, l.p.epochs)
				sent, failed = sent+s, failed+f
				if err != nil {
					failure = err
				}
			}
			l.p.letterBeats.Add(sent)
			if failed > 0 {
				l.p.letterBeatErrs.Add(failed)
				l.p.beatFails.Log(ctx, l.p.log, slog.LevelWarn, failedDeadLetterEvery,
					"in-progress failed for events waiting for their dead letters; JetStream may redeliver them meanwhile",
					"messages", failed, "error", failure.Error())
			}
		}
	}
}

// leave gives up lt at a hard stop: its message's share of the in-flight
// budget is released, and JetStream delivers its event again after
// ack_wait; unless the event's stream was re-created since it was taken,
// which leaves nothing to deliver it again: counted for close's log.
func (l *letterer) leave(lt *letter) {
	if lt.ev.Epoch != l.p.epochs.Current() {
		l.stale.Add(1)
	}
	Release(lt.ev.Msg)
}

// close ends the lanes once they have handed on what they hold, then the
// heartbeat, and waits. Call it after the worker has returned.
func (l *letterer) close() {
	for i := range l.lanes {
		l.lanes[i].close()
	}
	l.lanesWG.Wait()
	if n := l.stale.Load(); n > 0 {
		l.p.log.Error("hard stop: dead letters left unpublished for events whose stream was re-created since they were taken; "+
			"nothing delivers those events again, so they are lost unless their old stream still holds them",
			"events", n)
	}
	close(l.stop)
	l.beatWG.Wait()
}
