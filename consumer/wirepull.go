package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/pipeline"
)

// delivery is a message as push takes it: a *jetstream.Msg of nats.go's
// Consume, or a *wire.Msg.
type delivery interface {
	pipeline.Msg
	Subject() string
	Reply() string
	Data() []byte
}

// wireDialTimeout bounds one dial of the wire connection; after
// wireDialAttempts failed dials in a row while nats.go is connected, nats.go
// pulls instead (pullsWithWire).
const (
	wireDialTimeout  = 10 * time.Second
	wireDialAttempts = 3
)

// pullsWithWire reports whether this session pulls with consumer/wire:
// nats.pull_client is "wire" and nats.go is connected over a scheme wire
// speaks (not a websocket; then nats.go pulls, and Run says so once).
func (c *Consumer) pullsWithWire() bool {
	if c.cfg.PullClient == PullClientNATSGo || c.wireGaveUp.Load() {
		return false
	}
	u, err := url.Parse(c.nc.ConnectedUrl())
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		return true // wire.Dial judges the rest
	}
	if c.wsNoted.CompareAndSwap(false, true) {
		c.log.Info("nats.pull_client wire does not speak websocket; nats.go pulls", "url", connectedURL(c.nc))
	}
	return false
}

// wireConn returns the connection the wire pull client uses: the one it
// made before while that is alive, else a new one to the server nats.go
// is connected to, with the same credentials; when that one refuses, to
// another server nats.go knows of (a server in lame duck mode, as in a
// rolling restart, closes its listener seconds before it closes its
// clients: nats.go stays on it meanwhile). Run's goroutine only.
func (c *Consumer) wireConn(ctx context.Context) (*wire.Conn, error) {
	if wc := c.wc.Load(); wc != nil {
		select {
		case <-wc.Done():
		default:
			return wc, nil
		}
	}
	connected := c.nc.ConnectedUrl()
	if connected == "" {
		return nil, errors.New("connect the wire pull client: nats.go is not connected to any server")
	}
	o, err := c.wireOptions(connected)
	if err != nil {
		return nil, err
	}
	wc, err := dialWire(ctx, o, wireDialTimeout)
	if err != nil && ctx.Err() == nil {
		errs := []error{err}
		others := otherServers(connected, c.nc.Servers(), c.nc.DiscoveredServers(), c.cfg.URL)
		// They share one more timeout, each its share of it, 2 s at
		// least: a dial that cannot connect mostly fails at once
		// (refused), and one that hangs must neither hold Run for a
		// timeout per server nor leave none to the servers after it.
		octx, cancel := context.WithTimeout(ctx, wireDialTimeout)
		each := max(wireDialTimeout/time.Duration(max(len(others), 1)), 2*time.Second)
		for _, u := range others {
			if octx.Err() != nil {
				break
			}
			o, oerr := c.wireOptions(u)
			if oerr == nil {
				var derr error
				if wc, derr = dialWire(octx, o, each); derr == nil {
					err = nil
					break
				}
				oerr = derr
			}
			errs = append(errs, fmt.Errorf("%s: %w", serverOf(u), oerr))
		}
		cancel()
		if err != nil {
			err = errors.Join(errs...)
		}
	}
	if err != nil {
		if n := c.wireDialFails.Add(1); n >= wireDialAttempts && c.nc.IsConnected() {
			// nats.go reaches a server and wire reaches none (a
			// connection limit, a certificate for another name, ...):
			// consuming with nats.go beats not consuming.
			c.wireGaveUp.Store(true)
			c.log.Error("nats.pull_client wire could not connect; nats.go pulls until its connection is made again "+
				"(nats.max_in_flight_bytes does not bound it meanwhile)", "attempts", n, "err", err)
		}
		return nil, fmt.Errorf("connect the wire pull client: %w", err)
	}
	c.wireDialFails.Store(0)
	if old := c.wc.Swap(wc); old != nil {
		_ = old.Close()
	}
	// nats.go may have disconnected while the dial ran: its disconnect
	// handler aborts the wire connection it finds in c.wc, and this one
	// was not there yet. nats.go changes its status before it calls the
	// handler, so one of the two catches it: this look, after the Swap,
	// finds nats.go away and aborts it here, or the status changes after
	// this look and the handler, which runs after that, finds it in c.wc.
	// Pull only while the API (and the acks of a lost wire connection's
	// messages) can get through.
	if !c.nc.IsConnected() {
		wc.Abort()
		return nil, errors.New("connect the wire pull client: nats.go disconnected meanwhile")
	}
	return wc, nil
}

// dialWire dials with o within timeout.
func dialWire(ctx context.Context, o wire.Options, timeout time.Duration) (*wire.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return wire.Dial(dctx, o)
}

// otherServers is servers (nats.go's pool, which it gives without user
// information) but the one at connected, each with the user information
// nats.go connects to it with: a server given in configured (nats.url)
// that of its URL there; one nats.go discovered (one of discovered) that
// of connected, the URL nats.go was given (a user and password, or a
// token); otherwise none (nats.go then uses nats.user and nats.password,
// and so does wire).
func otherServers(connected string, servers, discovered []string, configured string) []string {
	cu, err := url.Parse(connected)
	if err != nil {
		return nil
	}
	given := configuredServers(configured)
	var out []string
	for _, s := range servers {
		u, err := url.Parse(s)
		if err != nil || u.Host == cu.Host {
			continue
		}
		if u.User == nil {
			if ui := given[serverKey(u)]; ui != nil {
				u.User = ui
			} else if slices.Contains(discovered, s) {
				u.User = cu.User
			}
		}
		out = append(out, u.String())
	}
	return out
}

// configuredServers maps each server of configured (nats.url), by
// serverKey, to the user information of its URL there, nil for none.
func configuredServers(configured string) map[string]*url.Userinfo {
	given := map[string]*url.Userinfo{}
	for c := range strings.SplitSeq(configured, ",") {
		if u, err := url.Parse(strings.TrimSpace(c)); err == nil && u.Host != "" {
			given[serverKey(u)] = u.User
		}
	}
	return given
}

// serverKey names the server of u as nats.go's pool does, so that a
// nats.url entry and the pool's entry for it match: host:port, with port
// 4222 when u has none (nats.go adds it: nats://alice:pw@n2 in nats.url
// is nats://n2:4222 in Servers()). Host names are compared in lower case,
// as DNS does. Websocket's default ports (80, 443) are not needed: wire
// never pulls over a websocket.
func serverKey(u *url.URL) string {
	return net.JoinHostPort(strings.ToLower(u.Hostname()), cmp.Or(u.Port(), "4222"))
}

// wireOptions are the consumer's connection settings for wire.Dial to the
// server at connected (one of nats.go's server URLs).
func (c *Consumer) wireOptions(connected string) (wire.Options, error) {
	cfg := &c.cfg
	o := wire.Options{
		URL:          connected,
		Name:         "jetsink",
		User:         cfg.User,
		Password:     cfg.Password,
		NKeyFile:     cfg.NKeyFile,
		CredsFile:    cfg.CredsFile,
		PingInterval: cmp.Or(cfg.pingEvery, pingInterval),
		MaxPingsOut:  maxPingsOut,
		// Settlements go over the wire connection while it is open and
		// through nats.go's connection after, which reconnects and buffers
		// meanwhile: a row committed after the wire connection died is
		// still acked, as with nats.go's own Consume.
		Settle: c.nc.Publish,
	}
	if cfg.dialer != nil {
		o.Dialer = cfg.dialer
	}
	// nats.go verifies a server it learned of from the cluster (its URL
	// holds an IP) against the configured URL's host name; so must wire,
	// whichever TLS settings it gets below (before, nats.tls.ca_file or
	// cert_file replaced them, and wire checked the certificate against
	// the IP). A server given in nats.url by its IP, nats.go verifies
	// against that IP, and so does wire: its pool is nats.url's servers
	// and the ones it learned of, so a server not in nats.url is learned.
	if cu, err := url.Parse(connected); err == nil && net.ParseIP(cu.Hostname()) != nil {
		_, given := configuredServers(cfg.URL)[serverKey(cu)]
		first, err := url.Parse(strings.TrimSpace(strings.Split(cfg.URL, ",")[0]))
		if !given && err == nil && first.Hostname() != "" && net.ParseIP(first.Hostname()) == nil {
			o.ServerName = first.Hostname()
		}
	}
	t, err := cfg.tlsFiles()
	if err != nil {
		return wire.Options{}, err
	}
	o.TLS = t
	return o, nil
}

// consumeWire starts a wire pull subscription on the consumer: handle
// takes its messages and onErr its errors, a missed heartbeat reported as
// jetstream.ErrNoHeartbeat and a pull nothing answered as
// nats.ErrNoResponders, as nats.go's Consume reports them. When the wire
// connection fails the Sub hands on what it holds and ends; Run then
// subscribes again, on a new connection.
// pullMessages is what the consumer pulls: Config.PullMessages, and a
// derived one no more than the consumer's max_request_batch (the server's
// jetstream limits may set it), which would refuse every pull beyond it.
func (c *Consumer) pullMessages() int {
	n := c.cfg.PullMessages()
	if limit := int(c.batchLimit.Load()); c.cfg.PullMaxMessages == 0 && limit > 0 {
		n = min(n, limit)
	}
	return n
}

func (c *Consumer) consumeWire(hard context.Context, s *session, handle func(delivery), onErr func(error)) (jetstream.ConsumeContext, error) {
	wc, err := c.wireConn(hard)
	if err != nil {
		return nil, err
	}
	cfg := &c.cfg
	budget := c.wireBudget(wc)
	c.bounded.Store(budget != nil) // before the Sub's first pull
	sub, err := wc.Consume(wire.PullOptions{
		Stream:      cfg.Stream,
		Consumer:    cfg.Consumer,
		APIPrefix:   cfg.APIPrefix(),
		MaxMessages: c.pullMessages(),
		MaxBytes:    c.wireMaxBytes(wc),
		Expires:     cfg.PullExpiry,
		Heartbeat:   cfg.PullHeartbeat,
		Budget:      budget,
	}, func(m *wire.Msg) { handle(m) }, func(err error) {
		switch {
		case errors.Is(err, wire.ErrNoHeartbeat):
			err = fmt.Errorf("%w (%w)", jetstream.ErrNoHeartbeat, err)
		case errors.Is(err, wire.ErrNoResponders):
			err = fmt.Errorf("%w (%w)", nats.ErrNoResponders, err)
		case errors.Is(err, wire.ErrConnectionClosed):
			s.connLost.Store(true)
			// The acks it had written and the server had not read are
			// gone with it; its messages are acked through nats.go's
			// connection from now on.
			c.acks.wireLost(wc)
			// What the Sub hands on now arrived before the connection
			// failed, and the stream may be replaced by the time it is
			// pushed: as after nats.go's reconnect, push (exactly-once)
			// verifies the stream first, and serve (at-least-once) looks
			// at it. This runs on the goroutine that pushes, before them.
			c.lookAgain()
		}
		onErr(err)
	})
	if err != nil {
		c.bounded.Store(false)
		return nil, err
	}
	return sub, nil
}

// wireMaxBytes is the pull size in bytes for a session pulling on wc
// (pullBytes for wc's server). Below max_payload, the wire client refuses
// to pull at all, and the session would be retried for ever.
func (c *Consumer) wireMaxBytes(wc *wire.Conn) int {
	return pullBytes(c.cfg.PullMaxBytes, int64(wc.MaxPayload()), c.log)
}

// wireBudget is the in-flight budget for a session pulling on wc, nil
// without one. When wc's server takes larger messages than the budget was
// made for (servers of a cluster differ in max_payload, or one changed it
// since New), the budget grows: a derived one (max_in_flight_bytes 0) to
// what is derived for that server; a set one too small for its largest
// message to the least that can pull it, with a warning. The messages in
// flight keep counting against the one budget.
func (c *Consumer) wireBudget(wc *wire.Conn) *wire.Budget {
	b := c.budget.Load()
	if b == nil {
		return nil
	}
	mp := int64(wc.MaxPayload())
	switch {
	case c.cfg.MaxInFlightBytes == 0 && c.cfg.inFlightBudget(mp) > b.Limit():
		b.Grow(c.cfg.inFlightBudget(mp))
		c.log.Warn("the wire connection's server takes larger messages than the in-flight budget was derived for; derived again",
			"max_payload", mp, "max_in_flight_bytes", b.Limit())
	default:
		if p, bad := inFlightProblem(b.Limit(), mp); bad {
			b.Grow(mp + pullBytesMargin)
			c.log.Warn(p.String()+"; raised to the least that can pull it", "server_max_payload", mp, "max_in_flight_bytes", b.Limit())
		}
	}
	return b
}
