package wire

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Options configure Dial. The zero value of every field but URL is a
// usable default.
type Options struct {
	// URL of one server: nats://host[:port] or tls://host[:port], with an
	// optional user:password@ (or token@), which replaces User, Password,
	// Token and NKeyFile, as in nats.go. The port defaults to 4222.
	URL string
	// Name is the connection name the server shows in its monitoring.
	Name string
	// User and Password authenticate with a user/password pair, the
	// password perhaps empty (as nats.go's UserInfo).
	User, Password string
	// Token authenticates with a token (as nats.go's Token), unless User is
	// set.
	Token string
	// NKeyFile is a file holding an NKey user seed: the server's nonce is
	// signed with it.
	NKeyFile string
	// CredsFile is a decorated credentials file (user JWT and seed).
	CredsFile string
	// TLS, when set, is used for the connection (a copy; ServerName
	// defaults to the URL's host). A server that requires TLS, or a tls://
	// URL, gets a default configuration when TLS is nil.
	TLS *tls.Config
	// ServerName, when set, is the name the server's certificate is
	// checked against instead of the URL's host, if TLS is used and
	// TLS.ServerName is empty: for a server dialled by the IP address
	// another server gave out, as nats.go does for those.
	ServerName string
	// PingInterval is how often the client pings the server (default 2m).
	PingInterval time.Duration
	// MaxPingsOut: when more pings than this are unanswered the connection
	// is closed with ErrStaleConnection (default 2). An interval in which
	// the reader, part-way through a frame, read more of it counts neither
	// way (a large message over a slow link holds the PONG behind it); a
	// frame whose bytes stop coming does not.
	MaxPingsOut int
	// WriteTimeout bounds each write to the socket (default 10s): a server
	// that stops reading fails the connection instead of blocking
	// settlements for ever.
	WriteTimeout time.Duration
	// Settle, when set, publishes the settlements (subject: the message's
	// reply subject; payload: "+ACK", "-NAK", ...) of this connection's
	// messages once it is closed: for example a nats.go connection that
	// reconnects and buffers meanwhile, so that a message can still be
	// acked after the connection that delivered it is gone. While the
	// connection is open they go over it. Settle must be safe for
	// concurrent use and must neither keep nor modify payload.
	Settle func(subject string, payload []byte) error
	// Dialer, when set, makes the TCP connection (nats.go's CustomDialer
	// satisfies it); the handshake is still bounded by Dial's ctx.
	Dialer interface {
		Dial(network, address string) (net.Conn, error)
	}
}

func (o *Options) withDefaults() error {
	if o.URL == "" {
		return fmt.Errorf("%w: URL is empty", ErrInvalidOptions)
	}
	if o.PingInterval < 0 || o.MaxPingsOut < 0 || o.WriteTimeout < 0 {
		return fmt.Errorf("%w: negative PingInterval, MaxPingsOut or WriteTimeout", ErrInvalidOptions)
	}
	o.PingInterval = cmp.Or(o.PingInterval, 2*time.Minute)
	o.MaxPingsOut = cmp.Or(o.MaxPingsOut, 2)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, 10*time.Second)
	if o.NKeyFile != "" && o.CredsFile != "" {
		return fmt.Errorf("%w: NKeyFile and CredsFile are exclusive", ErrInvalidOptions)
	}
	return nil
}

// maxPayloadCap is the largest max_payload a server can be configured
// with; a larger one in INFO is not believed, so that a frame header cannot
// make the reader allocate without bound.
const maxPayloadCap = 64 << 20

// serverInfo is the part of INFO the client uses.
type serverInfo struct {
	MaxPayload   int    `json:"max_payload"`
	TLSRequired  bool   `json:"tls_required"`
	TLSAvailable bool   `json:"tls_available"`
	Headers      bool   `json:"headers"`
	Nonce        string `json:"nonce"`
}

type connectInfo struct {
	Verbose      bool   `json:"verbose"`
	Pedantic     bool   `json:"pedantic"`
	TLSRequired  bool   `json:"tls_required"`
	Name         string `json:"name,omitempty"`
	Lang         string `json:"lang"`
	Version      string `json:"version"`
	Protocol     int    `json:"protocol"`
	Headers      bool   `json:"headers"`
	NoResponders bool   `json:"no_responders"`
	User         string `json:"user,omitempty"`
	Pass         string `json:"pass,omitempty"`
	Token        string `json:"auth_token,omitempty"`
	NKey         string `json:"nkey,omitempty"`
	JWT          string `json:"jwt,omitempty"`
	Sig          string `json:"sig,omitempty"`
}

// Conn is a connection to one NATS server. It owns three goroutines: the
// reader (parses what the server sends and hands messages to the Subs),
// the flusher (writes what settlements and pulls buffered) and the pinger.
// All end when the connection closes. Its methods are safe for concurrent
// use.
type Conn struct {
	id         uint64 // registry id
	nc         net.Conn
	clock      *readClock // when the reader last read from the socket (nil in some tests)
	opts       Options
	maxPayload int

	mu sync.Mutex // guards bw, pongs, sids and nextSID
	bw *bufio.Writer
	// pongs holds one entry per PING written and not yet answered, in
	// order: nil for the pinger's, a channel to close for Flush's and
	// Drain's.
	pongs   []chan struct{}
	nextSID uint64
	subs    atomic.Pointer[map[uint64]*Sub] // copied on write under mu

	kick     chan struct{} // wakes the flusher; capacity 1 coalesces
	pingsOut atomic.Int32
	closed   atomic.Bool
	byClose  atomic.Bool   // Close ended it, not a failure
	done     chan struct{} // closed when the connection has failed or closed
	// readDone is closed when the reader has returned: it goes on parsing
	// what it had read from the socket after done is closed, and a Sub
	// handing on what it holds waits for that (see Sub.handOnHeld).
	readDone chan struct{}
	failOnce sync.Once
	err      error // why; set before done is closed
	wg       sync.WaitGroup
}

// Dial connects to the server at o.URL, upgrades to TLS where configured or
// required, authenticates and waits for the server to confirm (PING/PONG).
// ctx bounds all of that, not the connection's life. Errors wrap
// ErrInvalidOptions (bad options or an unreadable key file),
// ErrAuthorization (the server refused the credentials; a *ServerError),
// ErrProtocol, or the network's error; none quotes a secret.
func Dial(ctx context.Context, o Options) (*Conn, error) {
	if err := o.withDefaults(); err != nil {
		return nil, err
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		// url's error quotes the URL, password included.
		return nil, fmt.Errorf("%w: URL does not parse", ErrInvalidOptions)
	}
	wantTLS := false
	switch u.Scheme {
	case "nats":
	case "tls":
		wantTLS = true
	default:
		return nil, fmt.Errorf("%w: URL scheme %q is not nats or tls", ErrInvalidOptions, u.Scheme)
	}
	host := u.Hostname()
	addr := net.JoinHostPort(host, cmp.Or(u.Port(), "4222"))
	if u.User != nil {
		// As nats.go's CONNECT: the URL's user information replaces the
		// user, password and nkey of the options (a creds file still
		// applies); user@ is a token, user:@ a user with an empty password.
		o.User, o.Password, o.Token, o.NKeyFile = "", "", "", ""
		if pass, pair := u.User.Password(); pair {
			o.User, o.Password = u.User.Username(), pass
		} else {
			o.Token = u.User.Username()
		}
	}
	var nc net.Conn
	if o.Dialer != nil {
		nc, err = o.Dialer.Dial("tcp", addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c, p, err := handshake(ctx, nc, &o, host, wantTLS || o.TLS != nil)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	c.wg.Add(3)
	// The reader goes on with the handshake's buffered reader, which may
	// already hold what the server sent after its PONG.
	go c.readLoop(p)
	go c.flushLoop()
	go c.pingLoop()
	return c, nil
}

// handshake reads INFO, upgrades to TLS, sends CONNECT and waits for the
// PONG that confirms it, all bounded by ctx. It returns the reader to go
// on reading with.
func handshake(ctx context.Context, nc net.Conn, o *Options, host string, wantTLS bool) (*Conn, parser, error) {
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (*Conn, parser, error) {
		if ctx.Err() != nil {
			return nil, parser{}, fmt.Errorf("connect: %w (%w)", ctx.Err(), err)
		}
		return nil, parser{}, err
	}
	clock := &readClock{r: nc}
	p := parser{br: bufio.NewReaderSize(clock, readBufSize), clock: clock}
	var f frame
	if err := p.next(&f); err != nil {
		return fail(fmt.Errorf("read INFO: %w", err))
	}
	if f.kind != frameInfo {
		return fail(protoErr("server did not start with INFO"))
	}
	var info serverInfo
	if err := json.Unmarshal(f.text, &info); err != nil {
		return fail(protoErr("INFO does not parse: %v", err))
	}
	if !info.Headers {
		return fail(fmt.Errorf("%w: server does not support headers", ErrProtocol))
	}
	var conn net.Conn = nc
	if wantTLS || info.TLSRequired {
		if !info.TLSRequired && !info.TLSAvailable {
			return fail(fmt.Errorf("%w: TLS configured but the server does not offer it", ErrInvalidOptions))
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.TLS != nil {
			cfg = o.TLS.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = cmp.Or(o.ServerName, host)
		}
		// The clock notes the reads beneath TLS: bytes arriving are what
		// tell that the server is there, and a read through TLS returns
		// only once a whole record (up to 16 KiB) has come, which below
		// ~130 kbit/s takes more than a second.
		tc := tls.Client(clockConn{Conn: nc, clock: clock}, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("tls handshake: %w", err))
		}
		conn = tc
		p.br = bufio.NewReaderSize(tc, readBufSize)
	}
	ci := connectInfo{
		TLSRequired: conn != nc, Name: o.Name, Lang: "go", Version: "jetsink-wire",
		Protocol: 1, Headers: true, NoResponders: true,
	}
	if err := credentials(&ci, o, info.Nonce); err != nil {
		return fail(err)
	}
	js, err := json.Marshal(&ci)
	if err != nil {
		return fail(fmt.Errorf("encode CONNECT: %w", err))
	}
	bw := bufio.NewWriterSize(conn, readBufSize)
	_, _ = bw.WriteString("CONNECT ")
	_, _ = bw.Write(js)
	_, _ = bw.WriteString("\r\nPING\r\n")
	clear(js) // it holds the password or signature
	if err := bw.Flush(); err != nil {
		return fail(fmt.Errorf("send CONNECT: %w", err))
	}
	for pong := false; !pong; {
		if err := p.next(&f); err != nil {
			return fail(fmt.Errorf("await CONNECT's answer: %w", err))
		}
		switch f.kind {
		case framePong:
			pong = true
		case framePing:
			_, _ = bw.WriteString("PONG\r\n")
			if err := bw.Flush(); err != nil {
				return fail(fmt.Errorf("send PONG: %w", err))
			}
		case frameErr:
			return fail(fmt.Errorf("connect: %w", &ServerError{Text: string(f.text)}))
		case frameMsg:
			return fail(protoErr("message before CONNECT was confirmed"))
		}
	}
	if !stop() {
		return fail(ctx.Err())
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	c := &Conn{
		nc:         &deadlineConn{Conn: conn, timeout: o.WriteTimeout},
		clock:      clock,
		opts:       *o,
		maxPayload: 1 << 20, // the server's default
		kick:       make(chan struct{}, 1),
		done:       make(chan struct{}),
		readDone:   make(chan struct{}),
	}
	if info.MaxPayload > 0 {
		c.maxPayload = min(info.MaxPayload, maxPayloadCap)
	}
	c.bw = bufio.NewWriterSize(c.nc, readBufSize)
	c.subs.Store(&map[uint64]*Sub{})
	c.id = registerConn(c, o.Settle)
	return c, p, nil
}

// credentials fills in the CONNECT fields for the configured auth kind.
func credentials(ci *connectInfo, o *Options, nonce string) error {
	switch {
	case o.User != "":
		ci.User, ci.Pass = o.User, o.Password
	case o.Token != "":
		ci.Token = o.Token
	}
	var file, what string
	switch {
	case o.NKeyFile != "":
		file, what = o.NKeyFile, "nkey file"
	case o.CredsFile != "":
		file, what = o.CredsFile, "creds file"
	default:
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("%w: read %s: %w", ErrInvalidOptions, what, err)
	}
	defer clear(b)
	var kp nkeys.KeyPair
	if o.CredsFile != "" {
		ci.JWT, kp, err = ParseCreds(b)
		if err != nil {
			return fmt.Errorf("%w: %s %q %w", ErrInvalidOptions, what, file, err)
		}
	} else if kp, err = nkeys.ParseDecoratedNKey(b); err != nil {
		// Its error may quote the file's contents: say only which file.
		return fmt.Errorf("%w: %s %q holds no valid NKey seed", ErrInvalidOptions, what, file)
	}
	defer kp.Wipe()
	if o.CredsFile == "" {
		pub, err := kp.PublicKey()
		if err != nil {
			return fmt.Errorf("%w: %s %q: no public key", ErrInvalidOptions, what, file)
		}
		ci.NKey = pub
	}
	if nonce != "" {
		sig, err := kp.Sign([]byte(nonce))
		if err != nil {
			return fmt.Errorf("sign the server's nonce: %w", err)
		}
		ci.Sig = base64.RawURLEncoding.EncodeToString(sig)
	}
	return nil
}

// ParseCreds returns the user JWT and the key pair of a NATS credentials
// file's contents b: a user JWT and the seed of the user it names. A file
// with a seed alone is refused: the JWT read from it would be the seed,
// sent to the server in the clear. Its errors, which say what is missing
// ("holds no user JWT", ...), never quote b.
func ParseCreds(b []byte) (string, nkeys.KeyPair, error) {
	token, err := nkeys.ParseDecoratedJWT(b)
	if err != nil {
		return "", nil, errors.New("holds no user JWT")
	}
	claims, err := natsjwt.DecodeUserClaims(token)
	if err != nil {
		return "", nil, errors.New("holds no user JWT")
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return "", nil, errors.New("holds no user NKey seed")
	}
	if pub, err := kp.PublicKey(); err != nil || pub != claims.Subject {
		kp.Wipe()
		return "", nil, errors.New("holds a seed that is not its JWT's user's")
	}
	return token, kp, nil
}

// deadlineConn bounds every write (see Options.WriteTimeout). Writes are
// coalesced by the bufio.Writer, so setting the deadline is paid per
// write to the socket, not per settlement.
type deadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (d *deadlineConn) Write(p []byte) (int, error) {
	if err := d.Conn.SetWriteDeadline(time.Now().Add(d.timeout)); err != nil {
		return 0, err
	}
	return d.Conn.Write(p)
}

// clockConn is the connection beneath TLS, its reads noted by clock (as
// readClock notes them without TLS).
type clockConn struct {
	net.Conn
	clock *readClock
}

func (c clockConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.clock.at.Store(time.Now().UnixNano())
	}
	return n, err
}

// MaxPayload is the server's max_payload.
func (c *Conn) MaxPayload() int { return c.maxPayload }

// LastRead is when bytes last came from the server (the wall clock, read
// once per read from the socket; no monotonic reading). Before a PING is
// taken for unanswered, it tells whether the server is still sending: a
// large message arriving over a slow link (64 MiB takes 5 s at 100 Mbit/s)
// holds the PONG behind it, as it holds the idle heartbeats, but the
// connection is alive.
func (c *Conn) LastRead() time.Time {
	if c.clock == nil {
		return time.Time{}
	}
	return time.Unix(0, c.clock.at.Load())
}

// receiving reports when the reader last read from the socket (Unix
// nanoseconds), whether it is waiting there for the rest of a frame, and
// that frame's sid.
func (c *Conn) receiving() (at int64, inFrame bool, sid uint64) {
	if c.clock == nil {
		return 0, false, 0
	}
	at = c.clock.at.Load()
	f := c.clock.inFrame.Load()
	return at, f != 0, f - 1
}

// Done is closed when the connection has closed or failed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended: ErrConnectionClosed after Close,
// ErrStaleConnection, a *ServerError, an ErrProtocol, or the read or write
// error; nil while it is open.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// fail closes the connection with err; the first error wins.
func (c *Conn) fail(err error) {
	c.failOnce.Do(func() {
		c.err = err
		c.closed.Store(true)
		unregisterConn(c.id)
		close(c.done)
		_ = c.nc.Close()
	})
}

// closedErr is the error a write on a closed connection returns.
func (c *Conn) closedErr() error {
	<-c.done
	if errors.Is(c.err, ErrConnectionClosed) {
		return c.err
	}
	return fmt.Errorf("%w: %w", ErrConnectionClosed, c.err)
}

// Close writes out what is buffered (bounded by Options.WriteTimeout),
// closes the connection and waits for its goroutines. Every Sub ends with
// ErrConnectionClosed; Close does not wait for their delivery goroutines
// (it may be called from a handler), their Closed channels tell. After a
// failure (or Abort) it changes nothing for the Subs: those that hand on
// what they hold still do. It returns the error of the final write, if
// any.
func (c *Conn) Close() error {
	var err error
	c.mu.Lock()
	if !c.closed.Load() {
		err = c.bw.Flush()
		// Only while open: a Sub of a connection that failed first may
		// not have looked at byClose yet, and must still hand on what it
		// holds rather than drop it.
		c.byClose.Store(true)
	}
	// Under the lock: a settlement after the final flush must fail, not
	// be buffered and dropped.
	c.closed.Store(true)
	c.mu.Unlock()
	c.fail(ErrConnectionClosed)
	c.wg.Wait()
	return err
}

// Abort ends the connection as a failure would, with an error wrapping
// ErrConnectionClosed: unlike after Close, a Sub settled through
// Options.Settle hands on what it holds before it ends. It waits for the
// connection's goroutines.
func (c *Conn) Abort() {
	c.fail(fmt.Errorf("%w: aborted", ErrConnectionClosed))
	c.wg.Wait()
}

// Flush returns once the server has read everything written before it:
// it sends a PING and waits for the PONG. Errors: ctx's, or one wrapping
// ErrConnectionClosed. ctx bounds the wait for the connection too: a write
// to a server that stopped reading holds it for up to
// Options.WriteTimeout.
func (c *Conn) Flush(ctx context.Context) error {
	ch := make(chan struct{})
	// Queued by a goroutine, which a write under way ends (or its
	// timeout, which closes the connection).
	queued := make(chan error, 1)
	go func() { queued <- c.ping(ch, nil) }()
	select {
	case err := <-queued:
		if err != nil {
			return err
		}
	case <-c.done:
		return c.closedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-c.done:
		return c.closedErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ping writes PING (after pre, if any) and queues ch to be closed by its
// PONG.
func (c *Conn) ping(ch chan struct{}, pre func(*bufio.Writer)) error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return c.closedErr()
	}
	if pre != nil {
		pre(c.bw)
	}
	_, _ = c.bw.WriteString("PING\r\n")
	c.pongs = append(c.pongs, ch)
	c.mu.Unlock()
	c.wake()
	return nil
}

// wake tells the flusher there is something to write; a pending wake-up
// covers this write too.
func (c *Conn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// write appends to the write buffer under the lock and wakes the flusher.
// A write error is not returned here: it surfaces in the flusher, which
// fails the connection.
func (c *Conn) write(fn func(*bufio.Writer)) error {
	if !c.lockOpen() {
		return c.closedErr()
	}
	fn(c.bw)
	c.mu.Unlock()
	c.wake()
	return nil
}

// settle publishes a settlement payload (verb, optional delay in ns,
// optional reason) to reply.
func (c *Conn) settle(reply, verb string, delay int64, reason string) error {
	if !c.lockOpen() {
		return c.closedErr()
	}
	if err := c.writeSettle(reply, verb, delay, reason); err != nil {
		c.mu.Unlock()
		c.fail(fmt.Errorf("write: %w", err))
		return c.closedErr()
	}
	c.mu.Unlock()
	c.wake()
	return nil
}

// lockOpen locks c.mu and reports true if c is open; when it is closed it
// unlocks and reports false.
func (c *Conn) lockOpen() bool {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return false
	}
	return true
}

// writeSettle writes a settlement into the write buffer, with c.mu held.
// The numbers are formatted in the buffer's free space, so nothing is
// allocated. When the buffer, full, could not be written out it marks c
// closed (bufio keeps the error and would drop every later write) and
// returns the error: nothing was sent, and the caller must fail c.
func (c *Conn) writeSettle(reply, verb string, delay int64, reason string) error {
	bw := c.bw
	_, _ = bw.WriteString("PUB ")
	_, _ = bw.WriteString(reply)
	var err error
	if tail := plainTail(verb); tail != "" && delay < 0 && reason == "" {
		_, err = bw.WriteString(tail)
	} else {
		n := len(verb)
		var num [20]byte
		if delay >= 0 {
			n += len(` {"delay":}`) + len(strconv.AppendInt(num[:0], delay, 10))
		}
		if reason != "" {
			n += 1 + len(reason)
		}
		_, _ = bw.Write(strconv.AppendInt(append(bw.AvailableBuffer(), ' '), int64(n), 10))
		_, _ = bw.WriteString("\r\n")
		_, _ = bw.WriteString(verb)
		if delay >= 0 {
			_, _ = bw.WriteString(` {"delay":`)
			_, _ = bw.Write(strconv.AppendInt(bw.AvailableBuffer(), delay, 10))
			_ = bw.WriteByte('}')
		}
		if reason != "" {
			_ = bw.WriteByte(' ')
			_, _ = bw.WriteString(reason)
		}
		_, err = bw.WriteString("\r\n")
	}
	if err != nil {
		c.closed.Store(true)
	}
	return err
}

// plainTail is what follows the reply subject in the PUB of a settlement
// without delay or reason: the size, the payload and the line ends.
func plainTail(verb string) string {
	switch verb {
	case "+ACK":
		return " 4\r\n+ACK\r\n"
	case "-NAK":
		return " 4\r\n-NAK\r\n"
	case "+WPI":
		return " 4\r\n+WPI\r\n"
	case "+TERM":
		return " 5\r\n+TERM\r\n"
	}
	return ""
}

// flushLoop writes the buffer out whenever woken: many settlements, one
// write.
func (c *Conn) flushLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-c.done:
			return
		}
		c.mu.Lock()
		var err error
		if c.bw.Buffered() > 0 && !c.closed.Load() {
			err = c.bw.Flush()
			if err != nil {
				// bufio keeps the error and drops later writes: no
				// settlement may be reported buffered from now on.
				c.closed.Store(true)
			}
		}
		c.mu.Unlock()
		if err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
	}
}

// pingLoop pings every PingInterval and gives the connection up when more
// than MaxPingsOut pings are unanswered. A tick that finds the reader
// part-way through a frame, and the socket read since the last tick,
// neither pings nor counts, nor forgets the pings out: the PONG waits
// behind that frame (64 MiB takes 54 s at 10 Mbit/s, and jetsink pings
// every 20 s, 2 out), and giving up there lost the message half-read, at
// each redelivery. A frame whose bytes stop coming counts as before. One
// whose bytes keep coming, however slowly, is bounded by its size (64 MiB
// at most) and by the server: its write deadline, and its own pings, whose
// PINGs wait behind the frame as well.
func (c *Conn) pingLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.PingInterval)
	defer t.Stop()
	last, _, _ := c.receiving()
	for {
		select {
		case <-t.C:
		case <-c.done:
			return
		}
		at, inFrame, _ := c.receiving()
		read := at != last
		last = at
		if read && inFrame {
			continue
		}
		if int(c.pingsOut.Add(1)) > c.opts.MaxPingsOut {
			c.fail(ErrStaleConnection)
			return
		}
		if c.ping(nil, nil) != nil {
			return
		}
	}
}

// readLoop parses what the server sends until the connection fails, and
// then what it had read already (the Subs hand on the messages in it):
// the socket's next read returns the error that ends it.
func (c *Conn) readLoop(p parser) {
	defer c.wg.Done()
	defer close(c.readDone)
	p.maxPayload = c.maxPayload
	var f frame
	for {
		if err := p.next(&f); err != nil {
			if c.closed.Load() {
				c.fail(err) // no-op: keeps the first error
			} else {
				c.fail(fmt.Errorf("read: %w", err))
			}
			return
		}
		switch f.kind {
		case frameMsg:
			c.dispatch(f.sid, f.msg)
		case framePing:
			_ = c.write(func(bw *bufio.Writer) { _, _ = bw.WriteString("PONG\r\n") })
		case framePong:
			c.pingsOut.Store(0)
			c.mu.Lock()
			var ch chan struct{}
			if len(c.pongs) > 0 {
				ch = c.pongs[0]
				c.pongs[0] = nil
				c.pongs = c.pongs[1:]
			}
			c.mu.Unlock()
			if ch != nil {
				close(ch)
			}
		case frameErr:
			e := &ServerError{Text: string(f.text)}
			if e.fatal() {
				c.fail(e)
				return
			}
			for _, s := range *c.subs.Load() {
				s.note(e)
			}
		case frameOK, frameInfo:
			// verbose is off; INFO updates (cluster URLs, lame duck mode)
			// matter only to a client that reconnects, which this is not.
		}
	}
}

// dispatch hands a message to the Sub its sid belongs to; one for a Sub
// that has ended is dropped (JetStream redelivers it after ack_wait).
func (c *Conn) dispatch(sid uint64, m *Msg) {
	s := (*c.subs.Load())[sid]
	if s == nil {
		return
	}
	m.conn = c.id
	s.receive(m)
}
