package wire

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PullOptions configure Consume. Zero values take the defaults noted.
type PullOptions struct {
	// Stream and Consumer name the durable pull consumer.
	Stream, Consumer string
	// APIPrefix is the JetStream API prefix (default "$JS.API"; a domain
	// or an imported account has another).
	APIPrefix string
	// MaxMessages is how many messages are kept requested and not yet
	// handled (default 500): the Sub asks for more once fewer than half of
	// them are outstanding, as nats.go's Consume does.
	MaxMessages int
	// MaxBytes, when > 0, caps the bytes each pull request may return
	// (max_bytes), as nats.go's PullMaxMessagesWithBytesLimit does, and
	// holds the messages waiting for the handler to typically about three
	// times that (see maybePull); it must not be below the largest
	// message, or that message stalls the consumer.
	MaxBytes int
	// Expires is each pull request's lifetime on the server (default 30s,
	// at least 1s).
	Expires time.Duration
	// Heartbeat is the idle heartbeat the server sends while a request
	// waits (default Expires/2, at most 30s; at most Expires/2).
	Heartbeat time.Duration
	// Budget, when set, bounds what the Sub's messages hold after the
	// handler took them (see Budget): the Sub pulls only while the
	// budget has room for a message of the server's max_payload (and its
	// subject and reply) beside the messages waiting for the handler, and
	// asks each pull for at most that room (and MaxBytes, or a quarter of
	// the budget up to 8 MiB). While it waits for room it opens no pull, and once no
	// pull is open the silence is not a missed heartbeat. Its Limit must
	// not be below max_payload + 8 KiB.
	Budget *Budget
	// StallAfter is how long the Sub waits for the Budget's room, with no
	// pull open and nothing released, before it reports a *StallError
	// through onErr (again each time the wait has doubled). Default 1
	// minute; it is measured in Heartbeat ticks.
	StallAfter time.Duration
}

func (o *PullOptions) withDefaults() error {
	for _, n := range []struct{ what, v string }{{"Stream", o.Stream}, {"Consumer", o.Consumer}} {
		if n.v == "" || strings.ContainsAny(n.v, " \t\r\n.*>") {
			return fmt.Errorf("%w: %s %q is not a valid name", ErrInvalidOptions, n.what, n.v)
		}
	}
	o.APIPrefix = strings.TrimSuffix(cmp.Or(o.APIPrefix, "$JS.API"), ".")
	if strings.ContainsAny(o.APIPrefix, " \t\r\n*>") || o.APIPrefix == "" {
		return fmt.Errorf("%w: APIPrefix %q is not a valid subject prefix", ErrInvalidOptions, o.APIPrefix)
	}
	if o.MaxMessages < 0 || o.MaxBytes < 0 || o.Expires < 0 || o.Heartbeat < 0 {
		return fmt.Errorf("%w: negative MaxMessages, MaxBytes, Expires or Heartbeat", ErrInvalidOptions)
	}
	o.MaxMessages = cmp.Or(o.MaxMessages, 500)
	o.Expires = cmp.Or(o.Expires, 30*time.Second)
	if o.Expires < time.Second {
		return fmt.Errorf("%w: Expires %v is below 1s", ErrInvalidOptions, o.Expires)
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = min(o.Expires/2, 30*time.Second)
	}
	if o.StallAfter < 0 {
		return fmt.Errorf("%w: negative StallAfter", ErrInvalidOptions)
	}
	o.StallAfter = cmp.Or(o.StallAfter, time.Minute)
	if o.Heartbeat > o.Expires/2 {
		return fmt.Errorf("%w: Heartbeat %v is above half of Expires %v", ErrInvalidOptions, o.Heartbeat, o.Expires)
	}
	return nil
}

// Sub is one pull subscription (see Conn.Consume). It owns one delivery
// goroutine, which runs the handler and onErr; the connection's reader
// hands it messages through a buffer of 2*MaxMessages (what is requested
// and unhandled is at most MaxMessages, twice that for a moment after a
// missed heartbeat re-pulls; should a server send more, the reader waits:
// memory stays bounded). Its methods are safe for concurrent use.
type Sub struct {
	c         *Conn
	sid       uint64
	opts      PullOptions
	handler   func(*Msg)
	taken     *Msg          // taken from ch as the connection failed (delivery goroutine only)
	held      atomic.Int64  // arrived and not yet handled: in ch, or in the handler
	heldBytes atomic.Int64  // what the server counted of them against max_bytes (pullSize), with MaxBytes or a Budget (see maybePull)
	wake      chan struct{} // the Budget's signal that it may have room (capacity 1)
	gated     atomic.Bool   // maybePull is waiting for the Budget's room
	onErr     func(error)
	threshold int
	pullHead  string // "PUB <api>.CONSUMER.MSG.NEXT.<stream>.<consumer> <inbox> "

	ch        chan *Msg
	notes     chan error    // non-terminal errors from the reader; sends never block
	quit      chan struct{} // closed when the delivery goroutine leaves
	halted    atomic.Bool   // Stop or a terminal status: deliver no more
	stop      chan struct{}
	stopped   sync.Once
	drain     sync.Once
	drained   chan struct{} // closed by the PONG that follows Drain's UNSUB
	unsub     atomic.Bool   // UNSUB written, or being written by Drain's writer
	fatal     chan struct{}
	fatalOnce sync.Once
	fErr      error // set before fatal is closed
	closed    chan struct{}
	err       error       // set before closed is closed
	status    atomic.Bool // the reader saw a status frame since the last look
	// uncapped: a run of tooBig answers came under a Budget without
	// MaxBytes; pulls ask for all the budget's room, not maxPullBytes,
	// until a message comes (pmu).
	uncapped bool
	// tooBig counts 409 "Message Size Exceeds MaxBytes" answers since the
	// last message (reader goroutine only): see onStatus.
	tooBig int
	// repull: a pull was refused in a way a pull sent at once would be
	// refused again as fast (see onStatus); the next one waits for the
	// delivery goroutine's heartbeat tick (pmu), whatever else would pull
	// (the Budget's wake, a message handled or its bytes spent).
	repull bool

	// openBytes is what the open pulls may still bring, with max_bytes on
	// them (MaxBytes or a Budget): their max_bytes less the pullSize of
	// what arrived and the Nats-Pending-Bytes of the statuses that ended
	// them. The server ends a pull whose bytes run out exactly without a
	// status, so at 0 no pull is open, whatever pending says (see
	// bytesRanOut). A pull that ends by its batch count with bytes unused
	// gets a 409 Batch Completed with them (nats-server 2.15; servers
	// that send none leave them counted), and maybePull sets openBytes to
	// 0 anyway when it sends a pull with every message requested arrived:
	// that status may still be on its way then, and its bytes are not the
	// new pull's to lose (see forgot). While an earlier pull is still
	// open, which messages are whose is not known (nats-server takes turns
	// among the pulls), so leftovers no status reports stay counted, a
	// later pull whose bytes run out exactly is not seen to end, and the
	// Sub pulls again at missed heartbeats. Added to under pmu; the reader
	// subtracts. A forced reset (missed heartbeats, a leadership change)
	// sets it to 0 while pulls the server still holds may bring more: then
	// it runs low, and a later step to 0 may come early and pull once too
	// often (bounded by the buffer, 2 x MaxMessages), until a reset that
	// is true.
	openBytes atomic.Int64
	// resets counts the times openBytes was set to 0 (forgetOpen); forgot
	// is what the last of them found there and no status has claimed
	// since (pmu). msgGen is resets as the last message arrived (reader
	// goroutine only). A 409 Batch Completed comes right after its pull's
	// last message; with a reset between (the next pull sent as that
	// message counted in held), that reset forgot the bytes it reports,
	// and they come off forgot before openBytes (onStatus). With a
	// replicated consumer the status comes before its pull's last message
	// (the server holds deliveries back until they are replicated): a
	// reset since, the one that sent its pull, found nothing of that
	// pull's in openBytes, only what was open before (usually nothing),
	// and the status's bytes come off openBytes as they should.
	resets atomic.Uint64
	forgot int64
	msgGen uint64

	pmu      sync.Mutex
	pending  int   // messages requested and not yet handled
	maxBytes int64 // the max_bytes of the last pull sent, 0 for none
	draining bool
	body     []byte

	// Drain's UNSUB and PING are written by a goroutine of its own (a
	// write under way holds the connection's lock, up to
	// Options.WriteTimeout), which the delivery goroutine waits for before
	// it ends. endMu orders the two: once ended is set, Drain starts none.
	endMu    sync.Mutex
	ended    bool
	unsubbed chan struct{} // closed when Drain's writer is done; nil without one
}

// Consume subscribes to a fresh inbox and pulls from the durable pull
// consumer o.Stream/o.Consumer, keeping about o.MaxMessages requested.
// handler runs on the Sub's delivery goroutine, one message at a time in
// the order the server sent them; the connection's reader never waits for
// it except when the buffer is full. onErr (may be nil) runs on the same
// goroutine with the Sub's errors: ErrNoHeartbeat (it pulls again by
// itself), *StatusError and *ServerError that do not end it, and, last,
// the error it ends with: ErrConsumerDeleted, ErrConsumerPushBased,
// ErrBadRequest, or one wrapping ErrConnectionClosed. When the connection
// fails (not Close), a Sub whose messages can still be settled
// (Options.Settle) reports that error first, then hands on the messages
// that had arrived (all the reader had read from the socket but any
// beyond a full buffer, 2 x MaxMessages, more than the pulls ask for:
// JetStream redelivers those after ack_wait), then ends. Errors returned:
// ErrInvalidOptions, or one wrapping ErrConnectionClosed.
func (c *Conn) Consume(o PullOptions, handler func(*Msg), onErr func(error)) (*Sub, error) {
	if err := o.withDefaults(); err != nil {
		return nil, err
	}
	if handler == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrInvalidOptions)
	}
	if o.MaxBytes > 0 && o.MaxBytes < c.maxPayload {
		// The server would answer every pull with 409 Message Size
		// Exceeds MaxBytes for a message larger than that, and the Sub
		// would pull again and again, delivering nothing.
		return nil, fmt.Errorf("%w: MaxBytes %d is below the server's max_payload %d", ErrInvalidOptions, o.MaxBytes, c.maxPayload)
	}
	if o.Budget != nil && o.Budget.Limit() < int64(c.maxPayload)+pullMargin {
		// No pull would ever have room for the largest message.
		return nil, fmt.Errorf("%w: Budget %d bytes is below the server's max_payload %d + %d", ErrInvalidOptions, o.Budget.Limit(), c.maxPayload, pullMargin)
	}
	if onErr == nil {
		onErr = func(error) {}
	}
	s := &Sub{
		c: c, opts: o, handler: handler, onErr: onErr,
		threshold: (o.MaxMessages + 1) / 2,
		ch:        make(chan *Msg, 2*o.MaxMessages),
		notes:     make(chan error, 8),
		quit:      make(chan struct{}),
		stop:      make(chan struct{}),
		drained:   make(chan struct{}),
		fatal:     make(chan struct{}),
		closed:    make(chan struct{}),
		wake:      make(chan struct{}, 1),
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil, c.closedErr()
	}
	c.nextSID++
	s.sid = c.nextSID
	inbox := "_INBOX." + rand.Text() + "." + strconv.FormatUint(s.sid, 10)
	s.pullHead = "PUB " + o.APIPrefix + ".CONSUMER.MSG.NEXT." + o.Stream + "." + o.Consumer + " " + inbox + " "
	subs := maps.Clone(*c.subs.Load())
	subs[s.sid] = s
	c.subs.Store(&subs)
	_, _ = c.bw.WriteString("SUB " + inbox + " " + strconv.FormatUint(s.sid, 10) + "\r\n")
	c.mu.Unlock()
	s.pmu.Lock()
	s.maybePull()
	s.pmu.Unlock()
	go s.run()
	return s, nil
}

// Drain stops pulling and unsubscribes; the Sub delivers what the server
// sent before the unsubscribe, then ends (Closed) with a nil Err. The
// messages it had requested and not sent, JetStream delivers to the next
// subscriber (after ack_wait if already on their way). It does not block,
// also while a write to a server that reads nothing holds the connection
// (the UNSUB waits for it on a goroutine of the Sub's, which ends before
// Closed; a Stop after Drain still ends the Sub at once).
func (s *Sub) Drain() {
	s.drain.Do(func() {
		s.pmu.Lock()
		s.draining = true
		s.pmu.Unlock()
		s.endMu.Lock()
		defer s.endMu.Unlock()
		if s.ended {
			return // leave unsubscribes, or the connection is gone
		}
		s.unsub.Store(true)
		written := make(chan struct{})
		s.unsubbed = written
		go func() {
			defer close(written)
			// The PONG to this PING comes after every message the server
			// sent before it read the UNSUB: once it closes drained, the
			// buffer holds all there is. On a closed connection the Sub
			// ends anyway.
			_ = s.c.ping(s.drained, func(bw *bufio.Writer) {
				_, _ = bw.WriteString("UNSUB " + strconv.FormatUint(s.sid, 10) + "\r\n")
			})
		}()
	})
}

// Stop ends the Sub now: the handler is not called again once it returns,
// and undelivered messages are dropped (JetStream redelivers them after
// ack_wait). It does not block; Closed tells when the handler has returned.
func (s *Sub) Stop() {
	s.stopped.Do(func() {
		s.halted.Store(true)
		close(s.stop)
	})
}

// Closed is closed once the delivery goroutine has returned: no handler
// or onErr call is running or will run.
func (s *Sub) Closed() <-chan struct{} { return s.closed }

// Err is the error the Sub ended with (see Consume), nil after Stop or
// Drain, and nil while it runs.
func (s *Sub) Err() error {
	select {
	case <-s.closed:
		return s.err
	default:
		return nil
	}
}

// receive runs on the connection's reader: a status goes to the pull
// accounting, a message to the delivery goroutine.
func (s *Sub) receive(m *Msg) {
	// A status has no reply subject; a stored message always has its
	// $JS.ACK one, whatever its headers say.
	if m.data == 0 && m.hdr > 0 && m.reply == 0 {
		if code, descr := m.status(); code != 0 {
			s.onStatus(code, descr, m)
			return
		}
	}
	if s.tooBig >= tooBigRun {
		// The message the run was about came: cap the pulls again.
		s.pmu.Lock()
		s.uncapped, s.repull = false, false
		s.pmu.Unlock()
	}
	s.tooBig = 0
	// Before it counts in held, which a reset waits for (maybePull).
	s.msgGen = s.resets.Load()
	// Its bytes come off openBytes before it counts in held: maybePull
	// (on the delivery goroutine too) forgets openBytes only once held
	// counts every message requested, so only once this one's bytes are
	// off. The other way round, a maybePull between the two set openBytes
	// to a new pull's max_bytes, and this message's bytes came off the new
	// pull's: an early step to 0, and a pull too many.
	ended := s.byteLimited() && s.spent(m.pullSize())
	s.held.Add(1)
	s.holdBytes(m, 1)
	if ended {
		s.bytesRanOut()
	}
	select {
	case s.ch <- m:
	default:
		// Full: wait for the handler, unless the Sub or the connection
		// ends (a handler may Close or Abort the connection, which waits
		// for this goroutine). What a failed connection's reader drops so,
		// beyond what the pulls asked for, JetStream redelivers after
		// ack_wait.
		select {
		case s.ch <- m:
		case <-s.quit:
			s.held.Add(-1)
			s.holdBytes(m, -1)
		case <-s.c.done:
			s.held.Add(-1)
			s.holdBytes(m, -1)
		}
	}
}

// note passes a non-terminal error to onErr; when onErr is behind, errors
// are dropped rather than stall the reader.
func (s *Sub) note(err error) {
	select {
	case s.notes <- err:
	default:
	}
}

// end ends the Sub with a terminal error.
func (s *Sub) end(err error) {
	s.fatalOnce.Do(func() {
		s.fErr = err
		s.halted.Store(true)
		close(s.fatal)
	})
}

// onStatus handles a JetStream status on the reader goroutine.
func (s *Sub) onStatus(code int, descr string, m *Msg) {
	s.status.Store(true)
	se := &StatusError{Code: code, Description: descr}
	var err error = se
	lower := strings.ToLower(descr)
	notify := true
	reset := false
	later := false // pull again at the next tick, not now
	completed := false
	// What the pull this status ends had left.
	left, _ := parseUint([]byte(m.HeaderGet("Nats-Pending-Messages")))
	leftBytes, _ := parseUint([]byte(m.HeaderGet("Nats-Pending-Bytes")))
	switch {
	case code == 100: // idle heartbeat (or flow control, not used by pulls)
		return
	case code == 400:
		s.end(fmt.Errorf("%w: %w", ErrBadRequest, se))
		return
	case code == 409 && strings.Contains(lower, "consumer deleted"):
		s.end(fmt.Errorf("%w: %w", ErrConsumerDeleted, se))
		return
	case code == 409 && strings.Contains(lower, "push based"):
		s.end(fmt.Errorf("%w: %w", ErrConsumerPushBased, se))
		return
	case code == 409 && strings.Contains(lower, "exceeded maxrequest"):
		// A pull past the consumer's max_request_batch, _expires or
		// _max_bytes: every pull of these options is refused the same
		// way, and nothing else would end the Sub (it pulled again after
		// missed heartbeats, for ever).
		s.end(fmt.Errorf("%w: %w: the consumer's limits refuse this client's pulls (batch %d, expires %v, max_bytes up to the budget's)",
			ErrBadRequest, se, s.opts.MaxMessages, s.opts.Expires))
		return
	case code == 409 && strings.Contains(lower, "exceeded maxwaiting"):
		// Too many pulls wait on the consumer (other clients'): this one
		// is gone. nats-server (2.15) says so only to a pull without
		// idle_heartbeat, which this Sub always sends: it drops this
		// Sub's refused pulls silently, and they stay counted until
		// missed heartbeats have the Sub pull afresh (put off while
		// another pull of its own is open: the server's heartbeats for
		// it come to the same inbox). This branch serves a server that
		// does say it: pull again at the next tick; one now would
		// likely be refused too.
		reset, later = true, true
	case code == 408, code == 404:
		notify = false // a request expired or found nothing: routine
	case code == 409 && strings.Contains(lower, "message size exceeds maxbytes"):
		// Routine when a pull's bytes run out after some messages: its
		// Nats-Pending-Bytes, what the pull had left, is then less than
		// it asked for. With a replicated consumer this status overtakes
		// those messages (the server holds a delivery back until the
		// delivered state is replicated, the status not), so only a pull
		// that took nothing counts. In a row with none between, the next
		// message is larger than MaxBytes (stored under a larger
		// max_payload elsewhere in a cluster): the Sub pulls again and
		// again and that message never comes. nats.go says nothing then;
		// say it once per such run.
		s.pmu.Lock()
		sent := s.maxBytes
		s.pmu.Unlock()
		if leftBytes != uint64(sent) {
			notify = false
			break
		}
		s.tooBig++
		if notify = s.tooBig == tooBigRun; notify {
			s.pmu.Lock()
			// A message stored under a larger max_payload elsewhere in a
			// cluster may still fit the budget's whole room.
			s.uncapped = true
			s.pmu.Unlock()
			err = fmt.Errorf("%w: the next message is larger than the pull's max_bytes (%d bytes: MaxBytes, or the Budget's room), %d pulls in a row got none: consuming is stuck until they are raised (nats.pull_max_bytes, nats.max_in_flight_bytes) or the message removed", se, sent, tooBigRun)
		}
		// Past the run (and the uncapped pull after it), a pull sent at
		// once gets the same answer at once: that loop would keep this
		// process and the server busy for nothing. One a tick finds out
		// whether the message went or the limits were raised.
		later = s.tooBig > tooBigRun
	case code == 409 && strings.Contains(lower, "batch completed"):
		// The pull ended by its batch count with bytes unused, which
		// nats-server 2.15 reports right after its last message.
		notify, completed = false, true
	case code == 409 && strings.Contains(lower, "leadership change"):
		reset = true // the new leader knows nothing of the requests
	case code == 503:
		// Nothing answered the pull (no_responders): it is gone, and one
		// sent now would most likely be refused as fast. The caller
		// hears at once, not after missed heartbeats.
		err = fmt.Errorf("%w: %w", ErrNoResponders, se)
		reset, later = true, true
	}
	s.pmu.Lock()
	if reset {
		// pending counts what is requested and not yet handled; of that,
		// only what has arrived is still real.
		s.pending = int(s.held.Load())
		s.forgetOpen()
	} else {
		s.pending = max(s.pending-int(min(left, uint64(s.opts.MaxMessages))), 0)
		n := int64(min(leftBytes, math.MaxInt64))
		if completed && s.msgGen != s.resets.Load() {
			// A reset came after this pull's last message (the delivery
			// goroutine sent the next pull as that message counted in
			// held): it forgot these bytes, and the pulls sent since
			// must not lose them too (openBytes early at 0, one pull too
			// many, MaxMessages passed).
			f := min(n, s.forgot)
			s.forgot -= f
			n -= f
		}
		if s.byteLimited() && s.spent(n) {
			s.noPullOpen()
		}
	}
	if s.repull = later; !later {
		s.maybePull()
	}
	s.pmu.Unlock()
	if notify {
		s.note(err)
	}
}

// maxPullBytes caps a pull's max_bytes under a Budget without MaxBytes
// (unless the largest message needs more; and not after a run of 409s
// that says the next message is larger, until it comes: uncapped). It
// binds for a budget above 32 MiB (a quarter of the budget otherwise): the
// server answers a pull in one burst, and closes a client that falls its
// max_pending (64 MiB by default) behind in reading, as unbudgeted pulls
// of 1,024 64 KiB events made it do in a bench drain (BENCHMARKS.md,
// session 32).
const maxPullBytes = 8 << 20

// tooBigRun is how many 409 "Message Size Exceeds MaxBytes" in a row, with
// no message between, make onStatus report a message too large to pull.
const tooBigRun = 3

// maybePull asks for more once fewer than half of MaxMessages are
// outstanding and, with MaxBytes, while the messages that arrived and are
// not yet handled hold fewer than MaxBytes bytes. Credit is counted in
// messages: a request cut short by its max_bytes gives back the rest
// (onStatus), and without the byte rule a slow handler would have the Sub
// pull again and again until half of MaxMessages waited, whatever their
// size (500 messages of 1 MiB for 1,000). With it, what waits is less
// than MaxBytes when a pull is sent, plus what the open pulls bring:
// typically one or two, so about three times MaxBytes; more when small
// messages left several pulls open with their bytes unused, and a burst
// of large ones fills them all (the server shares messages between them).
// pmu must be held.
func (s *Sub) maybePull() {
	if s.draining || s.halted.Load() || s.pending >= s.threshold {
		return
	}
	if s.opts.MaxBytes > 0 && s.heldBytes.Load() >= int64(s.opts.MaxBytes) {
		return // deliver pulls once the handler has taken enough
	}
	maxBytes := int64(s.opts.MaxBytes)
	if bud := s.opts.Budget; bud != nil {
		want := int64(s.c.maxPayload) + pullMargin
		free := bud.room(want, s.heldBytes.Load(), s.wake)
		if free < want {
			// The loop pulls when the budget signals room (wake), or
			// deliver when the handler has taken what waits.
			s.gated.Store(true)
			return
		}
		s.gated.Store(false)
		if maxBytes == 0 && !s.uncapped {
			maxBytes = max(min(bud.Limit()/4, maxPullBytes), want)
		}
		if maxBytes == 0 {
			maxBytes = free
		}
		maxBytes = min(maxBytes, free)
	}
	batch := s.opts.MaxMessages - s.pending
	if s.uncapped && s.opts.Budget != nil && s.opts.MaxBytes == 0 {
		// Uncapped for the one large message: one at a time, so that
		// the messages behind it cannot come in one burst of the whole
		// room either.
		batch = 1
	}
	if s.pending <= int(s.held.Load()) {
		// Every message requested has arrived: no pull is open, whatever
		// openBytes says. Unused max_bytes of a pull that ended by its
		// batch count would otherwise stay counted (a server without
		// 409 Batch Completed, or one whose status is still on its
		// way): a later pull whose bytes run out exactly would then
		// never bring openBytes to 0 (see bytesRanOut). The reader takes
		// a message's bytes off openBytes before it counts it in held
		// (receive): they are not taken off this pull's. A Batch
		// Completed still on its way takes its bytes off what this
		// forgot (onStatus).
		s.forgetOpen()
	}
	s.pending += batch
	s.maxBytes = maxBytes
	s.openBytes.Add(maxBytes)
	b := append(s.body[:0], `{"batch":`...)
	b = strconv.AppendInt(b, int64(batch), 10)
	if maxBytes > 0 {
		b = append(b, `,"max_bytes":`...)
		b = strconv.AppendInt(b, maxBytes, 10)
	}
	b = append(b, `,"expires":`...)
	b = strconv.AppendInt(b, int64(s.opts.Expires), 10)
	b = append(b, `,"idle_heartbeat":`...)
	b = strconv.AppendInt(b, int64(s.opts.Heartbeat), 10)
	b = append(b, '}')
	s.body = b
	// A closed connection ends the Sub through Conn.done; nothing to do.
	_ = s.c.write(func(bw *bufio.Writer) {
		_, _ = bw.WriteString(s.pullHead)
		_, _ = bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(b)), 10))
		_, _ = bw.WriteString("\r\n")
		_, _ = bw.Write(b)
		_, _ = bw.WriteString("\r\n")
	})
}

// run is the delivery goroutine.
func (s *Sub) run() {
	err := s.loop()
	told := false
	if s.c.opts.Settle != nil && errors.Is(err, ErrConnectionClosed) && !s.c.byClose.Load() {
		// The connection failed, but its messages can still be settled
		// (Options.Settle): hand on what arrived before it did, as
		// nats.go's Consume keeps its buffer across a reconnect, rather
		// than have JetStream deliver it again after ack_wait. The
		// handler hears the error first. Even with none held now: the
		// reader may still be parsing messages it had read.
		s.onErr(err)
		told = true
		err = s.handOnHeld(err)
	}
	close(s.quit)
	if s.opts.Budget != nil {
		s.opts.Budget.forget(s.wake)
	}
	s.endMu.Lock()
	s.ended = true
	unsubbed := s.unsubbed
	s.endMu.Unlock()
	s.leave()
	if unsubbed != nil {
		<-unsubbed // Drain's writer: no goroutine of the Sub's outlives Closed
	}
	if err != nil && !told {
		s.onErr(err)
	}
	s.err = err
	close(s.closed)
}

// handOnHeld delivers the messages s holds after its connection failed
// with err, and returns err; nil if Stop ends it first. It ends once the
// reader has: until then the reader may put more into ch, from what it
// had read before the failure, and an empty ch says nothing. The reader
// does not wait for it (receive gives up on a full ch once the
// connection is done), so the wait is short.
func (s *Sub) handOnHeld(err error) error {
	for reading := true; ; {
		select {
		case <-s.stop:
			return nil
		default:
		}
		if m := s.taken; m != nil {
			s.taken = nil
			s.hand(m)
			continue
		}
		select {
		case m := <-s.ch:
			s.hand(m)
			continue
		default:
		}
		if !reading {
			return err // the reader put in ch all it will, and ch is empty
		}
		select {
		case m := <-s.ch:
			s.hand(m)
		case <-s.c.readDone:
			reading = false
		case <-s.stop:
			return nil
		}
	}
}

// leave removes the Sub from the connection and unsubscribes, unless Drain
// did or the connection is gone.
func (s *Sub) leave() {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	subs := maps.Clone(*c.subs.Load())
	delete(subs, s.sid)
	c.subs.Store(&subs)
	if c.closed.Load() || s.unsub.Swap(true) {
		return
	}
	_, _ = c.bw.WriteString("UNSUB " + strconv.FormatUint(s.sid, 10) + "\r\n")
	c.wake()
}

// why says why the Sub is to end, if it is.
func (s *Sub) why() (error, bool) {
	select {
	case <-s.stop:
		return nil, true
	case <-s.fatal:
		return s.fErr, true
	case <-s.c.done:
		return s.c.closedErr(), true
	default:
		return nil, false
	}
}

func (s *Sub) loop() error {
	tick := time.NewTicker(s.opts.Heartbeat)
	defer tick.Stop()
	var handled, seen uint64
	idle := 0
	lastRead, _, _ := s.c.receiving()
	var stall stallWatch
	for {
		// While messages are waiting, take them without the full select;
		// two atomic loads notice Stop, a terminal status or a dead
		// connection.
		select {
		case m := <-s.ch:
			if s.halted.Load() || s.c.closed.Load() {
				if err, ok := s.why(); ok {
					s.taken = m // for handOnHeld
					return err
				}
			}
			s.deliver(m)
			handled++
			continue
		default:
		}
		select {
		case m := <-s.ch:
			if err, ok := s.why(); ok {
				s.taken = m // for handOnHeld
				return err
			}
			s.deliver(m)
			handled++
		case <-s.stop:
			return nil
		case <-s.fatal:
			return s.fErr
		case <-s.c.done:
			return s.c.closedErr()
		case err := <-s.notes:
			s.onErr(err)
		case <-s.wake:
			s.pmu.Lock()
			if !s.repull { // else the tick pulls
				s.maybePull()
			}
			s.pmu.Unlock()
		case <-s.drained:
			for {
				if err, ok := s.why(); ok {
					return err
				}
				select {
				case m := <-s.ch:
					s.deliver(m)
				default:
					return nil
				}
			}
		case <-tick.C:
			s.pmu.Lock()
			if s.repull {
				s.repull = false
				s.maybePull()
			}
			s.pmu.Unlock()
			at, inFrame, frameSID := s.c.receiving()
			read := at != lastRead
			lastRead = at
			// Silence is measured on this goroutine, as nats.go measures
			// it around its handler: a slow handler is not silence.
			if s.status.Swap(false) || handled != seen || len(s.ch) > 0 {
				seen, idle = handled, 0
				stall.reset()
				continue
			}
			s.pmu.Lock()
			// Nor is waiting for the Budget's room with no pull open.
			gated := !s.draining && s.gated.Load() && s.pending == 0
			quiet := s.draining || gated
			s.pmu.Unlock()
			if !gated {
				stall.reset()
			} else if b := s.opts.Budget; b != nil {
				held := b.Held()
				if waited, ok := stall.see(time.Now(), held, s.opts.StallAfter); ok {
					s.onErr(&StallError{Waited: waited, Held: held, Limit: b.Limit()})
				}
			}
			if quiet {
				idle = 0
				continue
			}
			if read && inFrame {
				// Nor is a frame the reader is part-way through, its
				// bytes still arriving: a heartbeat would wait behind it
				// (a large message over a slow link takes seconds). This
				// Sub's is life, as the message it brings will be: the
				// quiet ticks of pauses within it do not add up. Another
				// Sub's proves nothing of this one's pull: such a tick
				// counts neither way.
				if frameSID == s.sid {
					idle = 0
				}
				continue
			}
			if idle++; idle < 2 {
				continue
			}
			idle = 0
			s.onErr(ErrNoHeartbeat)
			// As nats.go: forget what was asked and ask afresh.
			s.pmu.Lock()
			s.pending = 0
			s.forgetOpen()
			s.maybePull()
			s.pmu.Unlock()
		}
	}
}

// stallWatch times a Sub's wait for its Budget's room during which the
// Budget's held bytes stay the same (see StallError).
type stallWatch struct {
	since time.Time // zero: not waiting
	held  int64     // the held bytes since since
	next  time.Duration
}

func (w *stallWatch) reset() { w.since = time.Time{} }

// see notes that the Sub still waits, with held bytes held, and reports
// how long the stall has lasted once it has lasted after, then 2 x after,
// 4 x after, and so on.
func (w *stallWatch) see(now time.Time, held int64, after time.Duration) (time.Duration, bool) {
	if w.since.IsZero() || held != w.held {
		w.since, w.held, w.next = now, held, after
		return 0, false
	}
	waited := now.Sub(w.since)
	if waited < w.next {
		return 0, false
	}
	w.next *= 2
	return waited, true
}

// byteLimited reports whether the Sub's pulls carry max_bytes.
func (s *Sub) byteLimited() bool { return s.opts.MaxBytes > 0 || s.opts.Budget != nil }

// bytesRanOut runs on the reader when an arrived message used up the last
// of the open pulls' max_bytes (spent), once it counts in held: no pull
// is open. A pull whose bytes run out exactly ends without a status
// (nats-server's nextWaiting gives it that one message and drops it), and
// the messages it did not bring would otherwise stay counted in pending
// until missed heartbeats (ErrNoHeartbeat) had the Sub pull afresh.
func (s *Sub) bytesRanOut() {
	s.pmu.Lock()
	if s.openBytes.Load() <= 0 { // no pull sent meanwhile
		s.noPullOpen()
		if !s.repull { // else the tick pulls (onStatus)
			s.maybePull()
		}
	}
	s.pmu.Unlock()
}

// spent subtracts n from openBytes and reports whether that used up the
// last of it. Only the step to 0 counts: should the server count a
// message's bytes differently from pullSize, openBytes runs below 0 and
// later messages do not each reset the accounting (and pull again).
func (s *Sub) spent(n int64) bool {
	v := s.openBytes.Add(-n)
	return v <= 0 && v+n > 0
}

// noPullOpen resets the pull accounting once no pull can bring more: of
// what pending counts, only what arrived is real. pmu must be held.
func (s *Sub) noPullOpen() {
	s.forgetOpen()
	s.pending = int(s.held.Load())
}

// forgetOpen sets openBytes to 0, keeping what it held in forgot for a
// 409 Batch Completed still on its way (see resets). pmu must be held.
func (s *Sub) forgetOpen() {
	s.forgot = max(s.openBytes.Swap(0), 0)
	s.resets.Add(1)
}

// holdBytes adds sign x m's pullSize to heldBytes, which only MaxBytes
// and a Budget need.
func (s *Sub) holdBytes(m *Msg, sign int64) {
	if s.opts.MaxBytes > 0 || s.opts.Budget != nil {
		s.heldBytes.Add(sign * m.pullSize())
	}
}

// hand gives m to the handler, holding its bytes of the Budget from now.
func (s *Sub) hand(m *Msg) {
	if s.opts.Budget != nil {
		m.hold(s.opts.Budget)
	}
	s.handler(m)
}

func (s *Sub) deliver(m *Msg) {
	s.hand(m) // m's bytes never change: its pullSize is the same after
	s.holdBytes(m, -1)
	s.pmu.Lock()
	// held with pending, under pmu: noPullOpen sets pending from held, and
	// m must leave both or neither.
	s.held.Add(-1)
	if s.pending > 0 {
		s.pending--
	}
	if !s.repull { // else the tick pulls (onStatus): messages held at a refusal must not each pull again
		s.maybePull()
	}
	s.pmu.Unlock()
}
