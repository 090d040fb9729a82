package wire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// readBufSize is the reader's buffer: every control line (INFO included)
// must fit in it, and payloads are copied out of it in one go.
const readBufSize = 64 << 10

// headerSlack is what a frame may exceed max_payload by: the server checks
// max_payload when a message is published, and JetStream may add a header
// or two when it delivers a stored message that was at the limit.
const headerSlack = 4 << 10

type frameKind uint8

const (
	frameMsg frameKind = iota + 1
	framePing
	framePong
	frameOK
	frameErr
	frameInfo
)

// frame is one parsed server operation.
type frame struct {
	kind frameKind
	sid  uint64
	msg  *Msg // frameMsg: the message, in its own allocation
	// text is INFO's JSON or -ERR's message. It aliases the read buffer:
	// valid only until the next call of next.
	text []byte
}

// parser reads server operations from br. maxPayload is the server's
// max_payload, 0 before INFO: until then readBufSize bounds MSG and HMSG
// frames, after it maxPayloadCap.
// clock, when set, is br's source, and stamps each message with the time
// of the read that completed it.
type parser struct {
	br         *bufio.Reader
	maxPayload int
	clock      *readClock
}

// readClock passes reads through and notes the wall-clock time of the last
// one that returned bytes: one clock reading per read from the socket,
// which under load brings many messages, instead of one per message (a
// clock reading costs ~0.1 µs on a KVM guest; profile in BENCHMARKS.md,
// session 23). One goroutine reads at a time; others look (Conn.LastRead,
// a Sub's heartbeat tick), hence the atomics, which cost one store per
// read from the socket and nothing per message. Under TLS the reads it
// notes are those beneath TLS (clockConn), and r is unused after the
// handshake's INFO.
type readClock struct {
	r  io.Reader
	at atomic.Int64 // Unix nanoseconds
	// inFrame is 1 + the sid of a frame the parser has read part of and
	// waits on the socket for the rest of (a large message on a slow
	// link), 0 for none: set only when the read buffer does not already
	// hold the rest. One store, so that a look sees the flag and the sid
	// together.
	inFrame atomic.Uint64
}

func (c *readClock) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if n > 0 {
		c.at.Store(time.Now().UnixNano())
	}
	return n, err
}

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
}

// next reads the next operation into f. Any error is final: the stream is
// out of step or gone. It never panics on any input.
func (p *parser) next(f *frame) error {
	line, err := p.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return protoErr("control line longer than %d bytes", readBufSize)
		}
		return err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	op, args := line, []byte(nil)
	if i := indexBlank(line); i >= 0 {
		op, args = line[:i], line[i+1:]
	}
	*f = frame{}
	switch {
	case equalFold(op, "MSG"):
		return p.msg(f, args, false)
	case equalFold(op, "HMSG"):
		return p.msg(f, args, true)
	case equalFold(op, "PING") && len(bytes.TrimSpace(args)) == 0:
		f.kind = framePing
	case equalFold(op, "PONG") && len(bytes.TrimSpace(args)) == 0:
		f.kind = framePong
	case equalFold(op, "+OK"):
		f.kind = frameOK
	case equalFold(op, "-ERR"):
		f.kind = frameErr
		t := bytes.TrimSpace(args)
		if len(t) >= 2 && t[0] == '\'' && t[len(t)-1] == '\'' {
			t = t[1 : len(t)-1]
		}
		f.text = t
	case equalFold(op, "INFO"):
		f.kind = frameInfo
		f.text = bytes.TrimSpace(args)
	default:
		return protoErr("unknown operation %.32q", line)
	}
	return nil
}

// msg parses the arguments of MSG (subject sid [reply] size) or HMSG
// (subject sid [reply] hdr-size total-size) and reads the body.
func (p *parser) msg(f *frame, args []byte, hmsg bool) error {
	var a [5][]byte
	n := 0
	for {
		args = trimBlanks(args)
		if len(args) == 0 {
			break
		}
		if n == len(a) {
			return protoErr("too many arguments in %s", opName(hmsg))
		}
		i := indexBlank(args)
		if i < 0 {
			i = len(args)
		}
		a[n], args = args[:i], args[i:]
		n++
	}
	var subj, sid, reply, hdrArg, sizeArg []byte
	switch {
	case !hmsg && n == 3:
		subj, sid, sizeArg = a[0], a[1], a[2]
	case !hmsg && n == 4:
		subj, sid, reply, sizeArg = a[0], a[1], a[2], a[3]
	case hmsg && n == 4:
		subj, sid, hdrArg, sizeArg = a[0], a[1], a[2], a[3]
	case hmsg && n == 5:
		subj, sid, reply, hdrArg, sizeArg = a[0], a[1], a[2], a[3], a[4]
	default:
		return protoErr("%s with %d arguments", opName(hmsg), n)
	}
	id, ok1 := parseUint(sid)
	total, ok2 := parseUint(sizeArg)
	hdr := uint64(0)
	ok3 := true
	if hmsg {
		hdr, ok3 = parseUint(hdrArg)
	}
	if !ok1 || !ok2 || !ok3 || hdr > total {
		return protoErr("bad %s arguments", opName(hmsg))
	}
	// Not this server's max_payload but the largest any server allows: in
	// a cluster or over a leafnode a stream may hold a message stored under
	// a larger limit elsewhere, which the server delivers unchecked, and
	// refusing it would fail the connection at every delivery, for ever.
	// The cap still bounds what one frame header can make the reader
	// allocate.
	limit := uint64(readBufSize)
	if p.maxPayload > 0 {
		limit = maxPayloadCap + headerSlack
	}
	if total > limit {
		return protoErr("%s of %d bytes exceeds max_payload", opName(hmsg), total)
	}
	m, body := newMsg(len(subj) + len(reply) + int(total))
	m.subj, m.reply, m.hdr, m.data = uint32(len(subj)), uint32(len(reply)), uint32(hdr), uint32(total-hdr)
	// The line aliases the read buffer, which the body read below reuses:
	// copy the subject and reply first.
	copy(body, subj)
	copy(body[len(subj):], reply)
	// Waiting on the socket for the rest of the frame: nothing the server
	// sent after it, a heartbeat or a PONG, can be read meanwhile.
	waits := p.clock != nil && p.br.Buffered() < int(total)+2
	if waits {
		p.clock.inFrame.Store(id + 1) // id < 10^19: no overflow
	}
	if _, err := io.ReadFull(p.br, body[len(subj)+len(reply):]); err != nil {
		return unexpectedEOF(err)
	}
	crlf, err := p.br.Peek(2)
	if err != nil {
		return unexpectedEOF(err)
	}
	if crlf[0] != '\r' || crlf[1] != '\n' {
		return protoErr("%s body not followed by CRLF", opName(hmsg))
	}
	_, _ = p.br.Discard(2) // cannot fail: Peek has the bytes
	if waits {
		p.clock.inFrame.Store(0)
	}
	if p.clock != nil {
		m.recv = p.clock.at.Load()
	}
	f.kind, f.sid, f.msg = frameMsg, id, m
	return nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func opName(hmsg bool) string {
	if hmsg {
		return "HMSG"
	}
	return "MSG"
}

// indexBlank is the index of the first space or tab in b, -1 if none. The
// server separates arguments with one space; tabs are legal and rare, so
// the vectorised search for a space goes first and the one for a tab only
// covers what precedes it (bytes.IndexAny tests byte by byte: 6% of
// jetsink's CPU in a drain, BENCHMARKS.md session 23).
func indexBlank(b []byte) int {
	i := bytes.IndexByte(b, ' ')
	head := b
	if i >= 0 {
		head = b[:i]
	}
	if j := bytes.IndexByte(head, '\t'); j >= 0 {
		return j
	}
	return i
}

func trimBlanks(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// parseUint parses a decimal of at most 19 digits (no overflow).
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// equalFold compares an operation name with an upper-case literal; the
// protocol allows any case.
func equalFold(b []byte, upper string) bool {
	if len(b) != len(upper) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != upper[i] {
			return false
		}
	}
	return true
}
