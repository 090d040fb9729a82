package wire

import (
	"fmt"
	"iter"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Msg is one message as the server delivered it. Its header and bytes live
// in ONE allocation: the Msg struct sits at the start of a []byte and the
// subject, reply, header block and payload follow it, so a message costs
// the garbage collector one object and no pointers to scan (see doc.go).
// That is why Msg has no pointer fields: the Conn is found through a
// registry by id, and the strings and slices it returns alias the bytes
// after it. Those bytes are never modified; callers must not modify them
// either.
//
// A Msg must not be copied (its bytes are not in the copy; vet's
// copylocks check catches it). It is safe for concurrent use: settlement
// is decided by an atomic.
type Msg struct {
	conn   uint64 // registry id of the Conn that delivered it
	subj   uint32 // lengths of the four parts that follow the struct
	reply  uint32
	hdr    uint32
	data   uint32
	state  atomic.Uint32 // settleNone, settleFinal
	budget atomic.Uint32 // id of the Budget it holds bytes of, 0 if none (see Budget)
	recv   int64         // Unix nanoseconds: the read that completed it, 0 if unknown
}

const msgSize = int(unsafe.Sizeof(Msg{}))

const (
	settleNone uint32 = iota
	settleFinal
)

// newMsg allocates the one []byte that holds a Msg and n bytes after it
// and returns both views of it.
func newMsg(n int) (*Msg, []byte) {
	buf := make([]byte, msgSize+n)
	// buf is pointer-free memory, at least 8-byte aligned (every size class
	// above the tiny allocator's 16 bytes is), and Msg has no pointers, so
	// the garbage collector is indifferent to the cast; *Msg keeps the
	// whole allocation alive as an interior pointer.
	m := (*Msg)(unsafe.Pointer(unsafe.SliceData(buf)))
	return m, buf[msgSize:]
}

// part returns n bytes of the message at off (counted from the end of the
// struct) as a string, "" when n is 0 so that no pointer past the
// allocation is ever formed.
func (m *Msg) part(off, n uint32) string {
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(m), msgSize+int(off))), n)
}

// Subject is the subject the message was published to.
func (m *Msg) Subject() string { return m.part(0, m.subj) }

// Reply is the reply subject: for a JetStream message its $JS.ACK subject,
// which holds the stream and consumer sequences and the delivery count.
func (m *Msg) Reply() string { return m.part(m.subj, m.reply) }

// Data is the payload, nil when empty. Its capacity equals its length, so
// appending copies; it must not be modified.
func (m *Msg) Data() []byte {
	if m.data == 0 {
		return nil
	}
	s := m.part(m.subj+m.reply+m.hdr, m.data)
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// Received is when the read from the connection that completed the message
// returned (the wall clock, read once per read from the socket, which may
// bring many messages), or the zero Time when not known. It carries no
// monotonic clock reading.
func (m *Msg) Received() time.Time {
	if m.recv == 0 {
		return time.Time{}
	}
	return time.Unix(0, m.recv)
}

// HeaderBlock is the raw header block ("NATS/1.0\r\nKey: value\r\n...\r\n"),
// "" when the message has none.
func (m *Msg) HeaderBlock() string { return m.part(m.subj+m.reply, m.hdr) }

// Size is the length of the header block plus the payload, what the
// server's max_payload bounds (against a pull's max_bytes it counts the
// subject and ack reply too).
func (m *Msg) Size() int { return int(m.hdr) + int(m.data) }

// HeaderGet returns the first value of the header field key, "" when there
// is none. The match is case-sensitive, as nats.Header.Get's is (nats.go
// keeps keys as the publisher sent them), so "Nats-Msg-Id" and
// "traceparent" are found as published. The value aliases the message and
// has its leading blanks removed, as nats.go does; nothing is allocated.
func (m *Msg) HeaderGet(key string) string {
	v, _ := m.HeaderLookup(key)
	return v
}

// HeaderLookup is HeaderGet that also says whether the field is there, so
// that a field with an empty value is told from a missing one.
func (m *Msg) HeaderLookup(key string) (string, bool) {
	h := headerFields(m.HeaderBlock())
	for {
		k, v, rest, ok := nextField(h)
		if !ok {
			return "", false
		}
		if k == key {
			return v, true
		}
		h = rest
	}
}

// HeaderFold returns the first value of the header field key matched
// exactly, or else the first matched ignoring case, "" when there is none:
// one pass over the block, where HeaderGet and then a case-blind search
// would take two for a missing field (every event that carries no
// traceparent, when tracing is on). Like HeaderGet it allocates nothing.
func (m *Msg) HeaderFold(key string) string {
	h := headerFields(m.HeaderBlock())
	folded, found := "", false
	for {
		k, v, rest, ok := nextField(h)
		if !ok {
			return folded
		}
		if len(k) == len(key) {
			if k == key {
				return v
			}
			if !found && strings.EqualFold(k, key) {
				folded, found = v, true
			}
		}
		h = rest
	}
}

// HeaderFields iterates over the header fields in the order they were
// sent, keys as sent and values as HeaderGet returns them; a key that
// appears more than once is visited once per value. Lines without a colon
// and empty keys are skipped, as nats.go skips empty keys.
func (m *Msg) HeaderFields() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		h := headerFields(m.HeaderBlock())
		for {
			k, v, rest, ok := nextField(h)
			if !ok || !yield(k, v) {
				return
			}
			h = rest
		}
	}
}

// headerFields skips the first line of a header block: "NATS/1.0" and an
// optional status.
func headerFields(h string) string {
	i := strings.IndexByte(h, '\n')
	if i < 0 {
		return ""
	}
	return h[i+1:]
}

// nextField returns the first field of h and what follows it; ok is false
// at the blank line that ends the block or at the end of h.
func nextField(h string) (key, value, rest string, ok bool) {
	for len(h) > 0 {
		var line string
		if i := strings.IndexByte(h, '\n'); i >= 0 {
			line, h = h[:i], h[i+1:]
		} else {
			line, h = h, ""
		}
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			return "", "", "", false
		}
		c := strings.IndexByte(line, ':')
		if c <= 0 {
			continue
		}
		return line[:c], strings.TrimLeft(line[c+1:], " \t"), h, true
	}
	return "", "", "", false
}

// status returns the status code and description of a message whose header
// block starts "NATS/1.0 <code> <description>", code 0 when it has none.
func (m *Msg) status() (code int, descr string) {
	h := m.HeaderBlock()
	const pre = "NATS/1.0 "
	if !strings.HasPrefix(h, pre) {
		return 0, ""
	}
	h = h[len(pre):]
	if i := strings.IndexByte(h, '\n'); i >= 0 {
		h = h[:i]
	}
	h = strings.TrimRight(h, "\r \t")
	if len(h) < 3 {
		return 0, ""
	}
	for i := range 3 {
		if h[i] < '0' || h[i] > '9' {
			return 0, ""
		}
		code = code*10 + int(h[i]-'0')
	}
	return code, strings.TrimSpace(h[3:])
}

// Ack acknowledges the message: JetStream will not deliver it again. It
// returns ErrMsgAlreadyAcked after a final settlement, ErrMsgNoReply, or an
// error wrapping ErrConnectionClosed. A nil error means the ack is buffered;
// Conn.Flush tells when the server has read it.
func (m *Msg) Ack() error { return m.settle("+ACK", -1, "", true) }

// AckAll acks every message of ms, as calling Ack on each would, and puts
// each one's result in errs (which must be at least as long as ms). The
// *Msg elements delivered by one open connection, one after another in ms,
// are written under one lock with one wake-up of its flusher: for
// committed batches, that is most of the cost of their acks. Any other
// element is acked with its own Ack method.
func AckAll[M interface{ Ack() error }](ms []M, errs []error) {
	errs = errs[:len(ms)]
	var rel releases // one release per run of messages of one Budget
	defer rel.flush()
	for i := 0; i < len(ms); {
		m, ok := any(ms[i]).(*Msg)
		var c *Conn
		if ok {
			if ref := lookupConn(m.conn); ref != nil {
				c = ref.conn.Load()
			}
		}
		if c == nil || !c.lockOpen() {
			errs[i] = ms[i].Ack()
			i++
			continue
		}
		var werr error
		for id := m.conn; i < len(ms); i++ {
			m, ok := any(ms[i]).(*Msg)
			if !ok || m.conn != id {
				break
			}
			reply, err := m.claim(true)
			if err == nil {
				rel.add(m)
				if werr = c.writeSettle(reply, "+ACK", -1, ""); werr != nil {
					m.state.Store(settleNone) // not sent
					break
				}
			}
			errs[i] = err
		}
		c.mu.Unlock()
		if werr != nil {
			// ms[i] and the rest go through Options.Settle, if set. The
			// acks buffered before the failed write may be lost, as on
			// any connection that fails: JetStream redelivers them.
			c.fail(fmt.Errorf("write: %w", werr))
			continue
		}
		c.wake()
	}
}

// Nak asks JetStream to deliver the message again now. Errors as Ack.
func (m *Msg) Nak() error { return m.settle("-NAK", -1, "", true) }

// NakWithDelay asks JetStream to deliver the message again after delay
// (a delay <= 0 is a plain Nak). Errors as Ack.
func (m *Msg) NakWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return m.Nak()
	}
	return m.settle("-NAK", int64(delay), "", true)
}

// InProgress resets the message's ack timer; it can be called any number
// of times before a final settlement. Errors as Ack.
func (m *Msg) InProgress() error { return m.settle("+WPI", -1, "", false) }

// Term tells JetStream never to deliver the message again. Errors as Ack.
func (m *Msg) Term() error { return m.settle("+TERM", -1, "", true) }

// TermWithReason is Term with a reason the server reports in its advisory.
// Errors as Ack.
func (m *Msg) TermWithReason(reason string) error {
	if reason == "" {
		return m.Term()
	}
	return m.settle("+TERM", -1, reason, true)
}

// releases gathers the Releases of messages of one Budget into one.
type releases struct {
	id uint32
	n  int64
}

// add releases m, or counts it to release with the others of its Budget.
func (r *releases) add(m *Msg) {
	id := m.budget.Swap(0)
	if id == 0 {
		return
	}
	if id != r.id {
		r.flush()
		r.id = id
	}
	r.n += m.pullSize()
}

func (r *releases) flush() {
	if r.n != 0 {
		if b := budgetByID(r.id); b != nil {
			b.release(r.n)
		}
	}
	r.id, r.n = 0, 0
}

// claim returns m's reply subject if m may be settled: for a final
// settlement it marks m settled, which the caller undoes if it cannot
// send it.
func (m *Msg) claim(final bool) (string, error) {
	reply := m.Reply()
	if reply == "" {
		return "", ErrMsgNoReply
	}
	if final {
		if !m.state.CompareAndSwap(settleNone, settleFinal) {
			return "", ErrMsgAlreadyAcked
		}
	} else if m.state.Load() != settleNone {
		return "", ErrMsgAlreadyAcked
	}
	return reply, nil
}

func (m *Msg) settle(verb string, delay int64, reason string, final bool) error {
	reply, err := m.claim(final)
	if err != nil {
		return err
	}
	if final {
		// Its life in the process ends here, sent or not.
		m.Release()
	}
	// On the connection that delivered it while that is open; after,
	// through Options.Settle if set.
	err = ErrConnectionClosed
	if ref := lookupConn(m.conn); ref != nil {
		if c := ref.conn.Load(); c != nil {
			err = c.settle(reply, verb, delay, reason)
		}
		if err != nil && ref.settle != nil {
			err = ref.settle(reply, settlePayload(verb, delay, reason))
		}
	}
	if err != nil && final {
		// Not sent: the caller may try again (on a closed connection it
		// will fail again; JetStream redelivers after ack_wait).
		m.state.Store(settleNone)
	}
	return err
}

// The registry maps a Msg's connection id to its Conn, so that Msg needs
// no pointer (see Msg). A Conn leaves it when it closes, which is also how
// a late settlement learns that the connection is gone; one with
// Options.Settle stays, without the Conn, since its messages can still be
// settled: for closedRefTTL, so that a connection that fails again and
// again for weeks does not grow the registry without bound. A message of
// a connection closed longer ago than that (held all that time) can no
// longer be settled: JetStream delivers it again.
var (
	registry   sync.Map // uint64 -> *connRef
	registryID atomic.Uint64

	closedMu   sync.Mutex
	closedRefs []closedRef // the entries kept with Options.Settle, oldest first
)

// closedRefTTL is how long a closed connection's messages can still be
// settled through Options.Settle: longer than a database outage during
// which they are held (and kept in progress) is likely to last; a
// connection failing every 10 s keeps ~9,000 entries of ~150 bytes. A
// variable for the tests, read and written under closedMu.
var closedRefTTL = 24 * time.Hour

// closedRef is a registry entry kept after its connection closed.
type closedRef struct {
	id uint64
	at time.Time
}

// connRef is a registry entry.
type connRef struct {
	conn   atomic.Pointer[Conn] // nil once the connection is closed
	settle func(subject string, payload []byte) error
}

func registerConn(c *Conn, settle func(string, []byte) error) uint64 {
	id := registryID.Add(1)
	ref := &connRef{settle: settle}
	ref.conn.Store(c)
	registry.Store(id, ref)
	return id
}

func unregisterConn(id uint64) {
	v, ok := registry.Load(id)
	if !ok {
		return
	}
	ref := v.(*connRef)
	ref.conn.Store(nil)
	if ref.settle == nil {
		registry.Delete(id)
		return
	}
	closedMu.Lock()
	defer closedMu.Unlock()
	now := time.Now()
	n := 0
	for n < len(closedRefs) && now.Sub(closedRefs[n].at) > closedRefTTL {
		registry.Delete(closedRefs[n].id)
		n++
	}
	closedRefs = append(closedRefs[n:], closedRef{id: id, at: now})
}

func lookupConn(id uint64) *connRef {
	v, ok := registry.Load(id)
	if !ok {
		return nil
	}
	return v.(*connRef)
}

// The settlements' payloads; only a delay or a reason makes one to order.
var (
	payloadAck  = []byte("+ACK")
	payloadNak  = []byte("-NAK")
	payloadWPI  = []byte("+WPI")
	payloadTerm = []byte("+TERM")
)

// settlePayload is what Conn.settle writes after the PUB line, for Options.Settle.
func settlePayload(verb string, delay int64, reason string) []byte {
	if delay < 0 && reason == "" {
		switch verb {
		case "+ACK":
			return payloadAck
		case "-NAK":
			return payloadNak
		case "+WPI":
			return payloadWPI
		case "+TERM":
			return payloadTerm
		}
	}
	p := []byte(verb)
	if delay >= 0 {
		p = strconv.AppendInt(append(p, ` {"delay":`...), delay, 10)
		p = append(p, '}')
	}
	if reason != "" {
		p = append(append(p, ' '), reason...)
	}
	return p
}
