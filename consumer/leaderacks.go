package consumer

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
)

// A consumer leader change loses acks (nats-server 2.15.2, consumer.go):
// the old leader drops the acks it has queued and not processed
// (setLeader: o.ackMsgs.drain()), and the proposals of those it has
// processed and not yet replicated (o.phead cleared, "none are valid
// anymore"; one forwarded under the old term is never committed), and the
// new leader takes the replicated state, in which those messages are still
// pending; an ack sent while no server holds the ack subscription (the old
// leader has unsubscribed, the new one not yet subscribed) reaches no one.
// All of them were sent around the change: just before it (the old
// leader replicates an ack in milliseconds) or during it. JetStream would
// deliver their events again after ack_wait, a duplicate row in
// at-least-once mode. So the consumer keeps the reply subjects of the acks
// sent in the last recentAckWindow (at most recentAckCap of them), and
// when a pull tells of a leader change (409 Leadership Change) it sends
// them again once the new leader delivers (the first message after the
// status: its delivery goroutine starts after its ack subscription, and
// the route that brings the message brought that interest before it). An
// ack of a message no longer pending is a no-op (processAckMsg finds no
// pending entry); one naming an older delivery count acks the message all
// the same (the pending entry is found by stream sequence; the count is
// only sampled), which is right: its row was committed.
//
// Acks sent in the window that the ring no longer holds (more than
// recentAckCap in recentAckWindow) are counted in
// Stats.AcksMaybeLostAtLeaderChange, not among a lost connection's
// (Stats.AcksUnconfirmed): the server has read them, and the new leader
// has nearly all of them; only those of the change's last moments may be
// lost, and the ring cannot tell which.
const (
	recentAckCap    = 4096
	recentAckWindow = 2 * time.Second
	recentAckBucket = 100 * time.Millisecond
	recentBuckets   = int(recentAckWindow/recentAckBucket) + 2
)

// recentAcks is the ring of recent acks' reply subjects, and per-bucket
// counts of every ack recorded (those the ring dropped too).
type recentAcks struct {
	mu    sync.Mutex
	slots []recentAck // a ring of recentAckCap, made at the first record
	next  int         // the slot written next
	// buckets count the acks recorded per recentAckBucket of time (the
	// bucket's index is at/recentAckBucket).
	buckets [recentBuckets]struct {
		idx int64
		n   uint64
	}
	total uint64 // every ack recorded
	// At the leader change told last: the acks recorded in the window
	// before it, and total then (tell). The buckets are written again
	// recentAckWindow later; these are not.
	toldWindow, toldTotal uint64
}

type recentAck struct {
	at    time.Duration // since Consumer.base (monotonic)
	epoch uint64
	reply []byte // reused when the slot is written again
}

// replier is what both pull clients' messages have: wire.Msg and
// jetstream.Msg.
type replier interface{ Reply() string }

// record notes the acks of ms that went out (errs[i] nil), sent at at
// under epoch.
func (r *recentAcks) record(at time.Duration, epoch uint64, ms []pipeline.Msg, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slots == nil {
		r.slots = make([]recentAck, recentAckCap)
	}
	b := &r.buckets[int(int64(at/recentAckBucket)%int64(recentBuckets))]
	if idx := int64(at / recentAckBucket); b.idx != idx {
		b.idx, b.n = idx, 0
	}
	for i, m := range ms {
		if errs[i] != nil {
			continue
		}
		rm, ok := m.(replier)
		if !ok {
			continue
		}
		// A copy: a wire message's reply aliases its whole buffer.
		s := &r.slots[r.next]
		s.at, s.epoch, s.reply = at, epoch, append(s.reply[:0], rm.Reply()...)
		r.next = (r.next + 1) % len(r.slots)
		b.n++
		r.total++
	}
}

// tell notes, for since, the acks recorded from from until now (by
// bucket): a leader change told now.
func (r *recentAcks) tell(from time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.toldWindow, r.toldTotal = 0, r.total
	first := int64(from / recentAckBucket)
	for _, b := range r.buckets {
		if b.idx >= first {
			r.toldWindow += b.n
		}
	}
}

// since returns copies of the reply subjects of epoch's acks recorded at
// or after from (by bucket), and how many acks were recorded since from in
// all (any epoch's: the ring may have dropped some): those counted at the
// last tell(from), and every one recorded after it.
func (r *recentAcks) since(from time.Duration, epoch uint64) (replies []string, recorded uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := int64(from / recentAckBucket)
	recorded = r.toldWindow + (r.total - r.toldTotal)
	var held uint64
	for _, s := range r.slots {
		if len(s.reply) == 0 || int64(s.at/recentAckBucket) < first {
			continue
		}
		held++
		if s.epoch == epoch {
			replies = append(replies, string(s.reply))
		}
	}
	// Of another epoch: not sent again (it would land on another
	// stream's event), and not in doubt either (the new epoch's flush
	// confirmed them).
	recorded -= min(recorded, held-uint64(len(replies)))
	return replies, recorded
}

// leadershipChange reports whether err is a pull's 409 Leadership Change,
// from either pull client.
func leadershipChange(err error) bool {
	if errors.Is(err, jetstream.ErrConsumerLeadershipChanged) {
		return true
	}
	var se *wire.StatusError
	return errors.As(err, &se) && se.Code == 409 && strings.Contains(strings.ToLower(se.Description), "leadership change")
}

// A leader change under back-pressure (every pull answered in full, none
// waiting at the new leader) gives no 409: the new leader sends one only
// to the pull requests replicated as waiting (nats-server 2.15.2,
// consumer.go: checkPendingRequests). So the consumer also listens, on
// nats.go's connection, for the advisory every new consumer leader
// publishes in the consumer's account (JSAdvisoryConsumerLeaderElectedPre,
// jetstream_cluster.go: sendConsumerLeaderElectAdvisory), on a subject a
// JetStream domain does not change. It comes just before the new leader
// takes over (setLeader follows it) and may beat its ack subscription to
// this client's server: the confirmer's second resend, a tick later,
// sends the window's acks, and those since, again.
const leaderElectedPrefix = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED."

// leaderElectedSubject is the subject of the advisory of a new leader of
// the consumer.
func (c *Consumer) leaderElectedSubject() string {
	return leaderElectedPrefix + c.cfg.Stream + "." + c.cfg.Consumer
}

// errLeaderElected is what leaderChanged logs for the advisory.
var errLeaderElected = errors.New("a new consumer leader was elected (JetStream advisory)")

// watchLeader subscribes to the advisory of a new leader of the consumer,
// on a clustered connection (a single server has no leader changes), and
// returns the subscription to end when Run does (nil: none).
func (c *Consumer) watchLeader() *nats.Subscription {
	if c.nc.ConnectedClusterName() == "" {
		return nil
	}
	subj := c.leaderElectedSubject()
	sub, err := c.nc.Subscribe(subj, func(*nats.Msg) { c.leaderChanged(errLeaderElected) })
	if err != nil {
		c.log.Warn("cannot listen for the consumer's leader changes; acks lost in one while every pull is answered come back after ack_wait",
			"subject", subj, "err", err)
		return nil
	}
	return sub
}

// noteLeaderWatchDenial logs, once, the server's refusal of the advisory
// subscription (an async permissions violation, which nats.go v1.55 hands
// to the error handler with no subscription: it is known by its subject),
// naming the subject to allow, and reports whether err was it.
func (c *Consumer) noteLeaderWatchDenial(err error) bool {
	subj := c.leaderElectedSubject()
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "Subscription to \""+subj+"\"") {
		return false
	}
	if c.leaderWatchDenied.CompareAndSwap(false, true) {
		c.log.Warn("not allowed to subscribe to the consumer's leader change advisory: acks lost in a leader change while "+
			"every pull is answered (jetsink behind a backlog) come back after ack_wait (a duplicate row in at-least-once mode); "+
			"allow subscribe to "+subj, "err", err)
	}
	return true
}

// leaderChangeSame is how close after a change told a pull's 409 is taken
// for the same change (a 409 per open pull, after the advisory). Each
// advisory is a change of its own: an election publishes one.
const leaderChangeSame = confirmEvery

// sinceBase is the monotonic time since New.
func (c *Consumer) sinceBase() time.Duration { return time.Since(c.base) }

// leaderChanged is told of a leader change, by a pull's status or the
// advisory (errLeaderElected): the acks of the window before it are sent
// again at the next delivery (push). Several told before that delivery
// are one change (its resend covers the acks since the first), and so is
// a pull's 409 within leaderChangeSame of the last change told; another
// advisory after the resend is another change.
func (c *Consumer) leaderChanged(err error) {
	at := c.sinceBase() + 1 // never 0: 0 is "none due"
	if c.resendFrom.Load() != 0 {
		return
	}
	if last := c.lastTold.Load(); last != 0 && at-time.Duration(last) < leaderChangeSame && !errors.Is(err, errLeaderElected) {
		return // a 409 of the change told
	}
	// Now: the buckets of the window are written again before a late
	// first delivery.
	c.recent.tell(max(at-1-recentAckWindow, 0))
	if !c.resendFrom.CompareAndSwap(0, int64(at)) {
		return
	}
	c.lastTold.Store(int64(at))
	c.log.Warn("the consumer's leader changed: acks sent around the change may be lost; those of the last "+
		recentAckWindow.String()+" are sent again once the new leader delivers (an event whose ack is lost "+
		"comes back after ack_wait: a duplicate row in at-least-once mode)", "err", err)
}

// resendAcks sends again, under epoch (the epoch of the delivery that
// calls it), the acks of epoch recorded from recentAckWindow before the
// leader change was told until now, once per change (the first caller
// after it takes it). Those the ring dropped are counted in
// Stats.AcksMaybeLostAtLeaderChange. While
// epoch is not the current one (serve has started a new epoch since, and
// the delivery is stale), nothing is sent and the change stays due. A
// change told more than resendStale ago (ack_wait) is dropped unsent, its
// acks counted so: their events have come back by then.
//
// It sends them once more at the ack confirmer's next tick (again), in
// case the first delivery came before the new leader's ack subscription
// reached the server this client is on (not seen: the one ack that
// seemed lost after a single resend, while the test was written, was a
// delivery the old leader dropped, never received).
func (c *Consumer) resendAcks(again bool, epoch uint64) {
	if again {
		// Taken first, then its epoch: a resend push stores (epoch,
		// then due) meanwhile is the one taken, with its epoch.
		told := c.resendAgain.Swap(0)
		if told == 0 {
			return
		}
		epoch = c.resendEpoch.Load()
		if c.epochs.Hold() != epoch {
			c.epochs.Release() // the epoch it was for is over
			return
		}
		defer c.epochs.Release()
		replies, _ := c.recent.since(max(time.Duration(told)-1-recentAckWindow, 0), epoch)
		c.sendAcks(replies)
		return // counted and told at the first
	}
	due := &c.resendFrom
	if due.Load() == 0 {
		return
	}
	if c.epochs.Hold() != epoch {
		c.epochs.Release()
		return
	}
	defer c.epochs.Release()
	told := due.Swap(0)
	if told == 0 {
		return
	}
	from := max(time.Duration(told)-1-recentAckWindow, 0)
	if c.sinceBase()-(time.Duration(told)-1) > c.resendStale() {
		_, recorded := c.recent.since(from, epoch)
		c.stats.acksMaybeLost.Add(recorded)
		c.log.Warn("no delivery since the consumer's leader change: its acks are not sent again; "+
			"their events may come back after ack_wait (a duplicate row in at-least-once mode)", "maybe_lost", recorded)
		return
	}
	c.resendEpoch.Store(epoch)
	c.resendAgain.Store(told)
	replies, recorded := c.recent.since(from, epoch)
	ok := c.sendAcks(replies)
	c.stats.acksResent.Add(uint64(ok))
	lost := recorded - min(recorded, uint64(len(replies))) + uint64(len(replies)-ok)
	c.stats.acksMaybeLost.Add(lost)
	if lost > 0 {
		c.log.Warn("acks sent again after the consumer's leader change; some sent around it were not kept to send again "+
			"(more than the last "+strconv.Itoa(recentAckCap)+"): their events may come back after ack_wait (a duplicate row in at-least-once mode)",
			"acks", ok, "maybe_lost", lost)
		return
	}
	c.log.Info("acks sent again after the consumer's leader change", "acks", ok)
}

// sendAcks publishes replies as acks on nats.go's connection, counted in
// the ack ledger as AckAll's are, and returns how many went out.
func (c *Consumer) sendAcks(replies []string) int {
	c.acks.begin(len(replies))
	ok := 0
	for _, reply := range replies {
		if err := c.nc.Publish(reply, ackBody); err == nil {
			ok++
		}
	}
	c.acks.end(len(replies), ok)
	return ok
}

// resendStale is how long a leader change stays due for a resend:
// nats.ack_wait (at least the window and a confirmation), after which the
// events whose acks it lost have come back anyway. A resend is only ever
// of the current epoch's acks, so a sink that holds push back for a few
// seconds (a lock, a slow commit) does not turn it into one that could
// land on another stream's events.
func (c *Consumer) resendStale() time.Duration {
	return max(c.cfg.AckWait, recentAckWindow+confirmEvery)
}

// ackBody is an ack's payload.
var ackBody = []byte("+ACK")
