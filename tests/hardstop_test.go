package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetsink/jetsink/processor"
	"github.com/jetsink/jetsink/sink"
)

// A hard stop (a second signal, drain_timeout) while NATS reads nothing:
// Run returns hard's error at once, although a committer is held in its
// acks' write (under the wire connection's lock, until its 10 s write
// timeout), and what comes after it (CloseStages, Shutdown) is bounded
// too. Before, Run waited for that write: 10 s, then as long again on
// nats.go's connection, past the ~2.5 s a cut-short stop promises (and
// with drain_timeout 30 s, past the 45 s grace that compose and Kubernetes
// are told to give: SIGKILL, exit 137).
func TestHardStopDoesNotWaitForAStuckAck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEnv(t)
	e.createStreams(ctx)
	proxy := newDeafProxy(t, strings.TrimPrefix(e.nats.URL(), "nats://"))

	// Their acks are more than the sockets between jetsink and the frozen
	// proxy hold (up to 4 MiB sent, 6 MiB received): ~300 bytes each, with
	// a consumer's name as long as JetStream takes, so that few events do
	// (a test under -race publishes slowly).
	const events = 50_000
	cfg := e.config(sink.AtLeastOnce)
	cfg.NATS.URL = proxy.URL()
	cfg.NATS.Consumer = "jetsink_" + strings.Repeat("x", 200)
	cfg.NATS.MaxInFlightBytes = 256 << 20
	cfg.NATS.MaxAckPending = 2 * events
	cfg.Pipeline.RingSize = 32768 // the rings hold them all while the table is locked
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := processor.New(ctx, cfg, log)
	if err != nil {
		t.Fatalf("processor.New: %v", err)
	}
	intake, stopIntake := context.WithCancel(ctx)
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- p.Run(intake, hard) }()
	t.Cleanup(func() {
		stopIntake()
		stopHard()
		<-done
		proxy.Close() // ends the writes it held
		p.Close()
	})

	tx := e.lockTable(ctx, e.pg.Conn(t), "ACCESS EXCLUSIVE")
	e.publish(ctx, 0, events, 4)
	waitFor(t, ctx, "jetsink to take the events in", func() (bool, string) {
		n := p.Consumer().Stats().Received
		return n >= events, fmt.Sprintf("%d received", n)
	})
	proxy.Freeze()
	if err := tx.Rollback(ctx); err != nil { // the rows commit, and their acks fill the sockets
		t.Fatal(err)
	}
	// Until the commits stop: the committers are held by the write of
	// their acks (or have committed everything, which the log tells below).
	for last := int64(-1); ; {
		select {
		case err := <-done:
			t.Fatalf("Run returned before the stop: %v", err)
		case <-time.After(time.Second):
		}
		n := e.rows(ctx)
		if n == last {
			break
		}
		last = n
	}

	stopIntake()
	stopHard() // a second signal
	start := time.Now()
	select {
	case err = <-done:
		done <- err // for Cleanup
	case <-time.After(6 * time.Second):
		t.Fatalf("Run still runs 6 s after hard's end (it waits for an ack that NATS does not read); log:\n%s", logs.String())
	}
	ran := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want hard's error (context.Canceled)", err)
	}
	held := regexp.MustCompile(`not waiting any longer for stages still running.* stages=(\S*)`).FindStringSubmatch(logs.String())
	if held == nil || !slices.Contains(strings.Split(held[1], ","), "sink") {
		t.Fatalf("no Warn naming the sink as held (did the acks fill the sockets? %d of %d rows committed); log:\n%s",
			e.rows(ctx), events, logs.String())
	}
	// The consumer is held by nothing: the acks' write holds the wire
	// connection's lock, which nothing on its way out waits for.
	if held[1] != "sink" {
		t.Errorf("the hard stop gave up waiting for stages=%s, want the sink alone (the consumer returns at hard's end)", held[1])
	}
	// What follows Run is bounded as well: cmd calls these next.
	if err := p.CloseStages(hard); err == nil {
		t.Error("CloseStages = nil, want the acks it could not confirm")
	}
	_ = p.Shutdown(hard)
	if d := time.Since(start); d > 9*time.Second {
		t.Errorf("Run, CloseStages and Shutdown took %v after hard's end (Run %v), want a few seconds", d, ran)
	}
	t.Logf("Run returned %v after hard's end; CloseStages and Shutdown %v after it; %d of %d rows committed",
		ran, time.Since(start)-ran, e.rows(ctx), events)
}

// deafProxy forwards TCP connections to a target until Freeze, after which
// it reads nothing more from either side, as a frozen server or a partition
// that drops packets: a writer fills the socket's buffers and then blocks.
type deafProxy struct {
	ln      net.Listener
	target  string
	frozen  chan struct{} // closed by Freeze
	freeze  sync.Once
	closing chan struct{} // closed by Close
	close   sync.Once
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newDeafProxy(t *testing.T, target string) *deafProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &deafProxy{ln: ln, target: target, frozen: make(chan struct{}), closing: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

func (p *deafProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Freeze stops reading, keeping the connections open.
func (p *deafProxy) Freeze() { p.freeze.Do(func() { close(p.frozen) }) }

// Close closes the listener and every connection, and waits for the pipes.
func (p *deafProxy) Close() {
	p.close.Do(func() { close(p.closing) })
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *deafProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// pipe copies src to dst until Freeze (then, after what it has read, it
// waits for Close) or a failure; then it closes both.
func (p *deafProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		select {
		case <-p.frozen:
			<-p.closing
			return
		default:
		}
		n, err := src.Read(buf)
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
