package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
)

// Problem is one thing Check found wrong (Warning false: run would fail or
// misbehave) or worth knowing (Warning true).
type Problem struct {
	Warning bool
	// Config: a setting is at fault, which run refuses as a bad
	// configuration (New returns ErrInvalidConfig) once it sees the
	// server; check exits 2 for it, as run would.
	Config  bool
	Message string
	Fix     string
}

// pullBytesMargin is what a delivered message counts beyond the payload
// and headers that max_payload bounds: the server charges a pull's
// max_bytes with the subject and the ack reply subject too (nats-server's
// consumer.go), and a subject may take most of a 4 KiB protocol line.
const pullBytesMargin = 8 << 10

// pullMaxBytesProblem judges nats.pull_max_bytes against the server's
// max_payload: below it, an error (a larger message would never be
// pulled, New refuses it); within pullBytesMargin above it, a warning (a
// message close to max_payload would not be, with its subject and ack
// reply); ok is false when there is nothing to say.
func pullMaxBytesProblem(pullMaxBytes int, maxPayload int64) (p Problem, ok bool) {
	switch {
	case pullMaxBytes <= 0 || int64(pullMaxBytes) >= maxPayload+pullBytesMargin:
		return Problem{}, false
	case int64(pullMaxBytes) < maxPayload:
		return Problem{Config: true, Message: fmt.Sprintf("nats.pull_max_bytes (%d) is below the server's max_payload (%d): a larger message would stall the consumer",
			pullMaxBytes, maxPayload), Fix: fmt.Sprintf("set nats.pull_max_bytes to %d or more, or 0", maxPayload+pullBytesMargin)}, true
	}
	return Problem{Warning: true, Message: fmt.Sprintf("nats.pull_max_bytes (%d) leaves less than %d bytes above the server's max_payload (%d) for a message's subject and ack reply, "+
		"which the server counts too: a message close to max_payload could not be pulled, so jetsink pulls up to %d bytes", pullMaxBytes, pullBytesMargin, maxPayload, maxPayload+pullBytesMargin),
		Fix: fmt.Sprintf("set nats.pull_max_bytes to %d or more, or 0", maxPayload+pullBytesMargin)}, true
}

// pullBytes is the max_bytes of the pulls from a server taking messages
// of up to maxPayload: nats.pull_max_bytes, raised to the least that can
// pull the largest message with its subject and ack reply (a message the
// server finds larger than a pull's max_bytes is refused to every pull:
// consuming stops there). It logs the raise when pull_max_bytes is below
// maxPayload (New refuses that for the server it connects to first; this
// is another server of the cluster, or one whose max_payload grew), and
// not within the margin above it (New warned of that).
func pullBytes(pullMaxBytes int, maxPayload int64, log *slog.Logger) int {
	p, bad := pullMaxBytesProblem(pullMaxBytes, maxPayload)
	if !bad {
		return pullMaxBytes
	}
	n := int(maxPayload + pullBytesMargin)
	if !p.Warning {
		log.Warn(p.String()+"; raised to the least that can pull it for this connection", "server_max_payload", maxPayload, "pull_max_bytes", n)
	}
	return n
}

// inFlightProblem is the Problem of a max_in_flight_bytes (budget, as
// Config.inFlightBudget gives it) too small for a message of the server's
// max_payload: nothing could be pulled. Its fix names the least budget
// taken (max_payload + pullBytesMargin) and what 0 derives.
func inFlightProblem(budget, maxPayload int64) (p Problem, ok bool) {
	if budget == 0 || budget >= maxPayload+pullBytesMargin {
		return Problem{}, false
	}
	return Problem{Config: true, Message: fmt.Sprintf("nats.max_in_flight_bytes (%d) is below the server's max_payload (%d) + %d: the largest message could never be pulled",
		budget, maxPayload, pullBytesMargin), Fix: fmt.Sprintf("set nats.max_in_flight_bytes to %d or more (the least that holds the largest message), or 0 (derived: %d)",
		maxPayload+pullBytesMargin, Config{}.inFlightBudget(maxPayload))}, true
}

func (p Problem) String() string {
	if p.Fix == "" {
		return p.Message
	}
	return p.Message + "; fix: " + p.Fix
}

// Check connects to NATS and reports what `jetsink run` would find, without
// creating or changing anything: the stream, the durable consumer, and a
// stream capturing the dead-letter subject; with cfg.StoredSeq, a stream
// whose sequence restarted under the table's rows (see Run); with
// cfg.Destination, a durable whose record names another destination (a
// warning: see destinationKey), or a durable yet to be made beside
// another of that destination (an error in at-least-once mode, a warning
// with StoredSeq: siblingProblem); a connection in the clear that carries
// credentials to an address that is not loopback (a warning:
// clearTextProblem). The error is for a failure to check at all (bad config wraps ErrInvalidConfig; an unreachable server is
// the connect error).
func Check(ctx context.Context, cfg Config, log *slog.Logger) ([]Problem, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	// Only for natsOptions: the timeouts, gaps and intervals New sets stay
	// zero here, so a look such as streamInfo must not be made through c.
	c := &Consumer{cfg: cfg, log: log, closed: make(chan struct{})}
	opts, err := c.natsOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.MaxReconnects(0), nats.Timeout(5*time.Second))
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, cfg.ConnectError(err)
	}
	defer nc.Close()
	js, err := cfg.JetStream(nc)
	if err != nil {
		return nil, err
	}
	// A request the server refuses the user waits out its timeout and
	// names no permission: check names the subject to allow, as New does.
	before := nc.LastError()
	account, err := js.AccountInfo(ctx)
	if err != nil {
		where := "JetStream is not available on nats.url"
		if cfg.Domain != "" {
			where = fmt.Sprintf("JetStream domain %q (nats.domain) is not available on nats.url", cfg.Domain)
		}
		switch {
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrNoResponders):
			// No JetStream here at all, or not in that domain: New's words.
			return nil, fmt.Errorf("%s: %w (%s)", where, err, noJetStreamHint(cfg.Domain))
		case jetStreamSilent(err):
			// In run's words (why): a timeout alone says nothing of a
			// full store disk or a cluster without a meta leader.
			where += ": " + jetStreamGone
		}
		return nil, apiDenialError(nc, &cfg, before, fmt.Errorf("%s: %w", where, err))
	}
	var problems []Problem
	if p, ok := clearTextProblem(nc, &cfg); ok {
		problems = append(problems, p)
	}
	if p, ok := accountAckPendingProblem(account.Limits.MaxAckPending, &cfg); ok {
		problems = append(problems, p)
	}
	if p, ok := pullMaxBytesProblem(cfg.PullMaxBytes, nc.MaxPayload()); ok {
		problems = append(problems, p) // an error of New too: run would exit 2
	}
	if p, ok := inFlightProblem(cfg.inFlightBudget(nc.MaxPayload()), nc.MaxPayload()); ok && cfg.PullClient != PullClientNATSGo {
		problems = append(problems, p) // an error of New too
	}
	// The event stream as run will have it (create_stream), for the
	// dead-letter stream's check; nil when there is none.
	var events *jetstream.StreamConfig
	var found *jetstream.StreamConfig // the event stream as it is, when it is there
	stream, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && cfg.CreateStream:
		problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("stream %s does not exist yet; run will create it (create_stream: true)", cfg.Stream)})
		made := jetstream.StreamConfig{Name: cfg.Stream, MaxAge: cfg.StreamMaxAge, MaxBytes: cfg.StreamMaxBytes, Replicas: cfg.StreamReplicas,
			Duplicates: cfg.StreamDuplicateWindow, Storage: jetstream.FileStorage}
		events = &made
		problems = append(problems, eventStreamLimits(&made, &cfg)...)
		if p, ok := replicaProblem(clusterOf(nc, &cfg), &made); ok {
			problems = append(problems, p)
		}
	case errors.Is(err, jetstream.ErrStreamNotFound):
		problems = append(problems, Problem{Message: fmt.Sprintf("stream %s does not exist", cfg.Stream),
			Fix: fmt.Sprintf("create it (nats stream add %s --subjects <the subjects it captures> --defaults) or set nats.create_stream: true", shellWord(cfg.Stream))})
	case err != nil:
		return nil, apiDenialError(nc, &cfg, before, fmt.Errorf("look up stream %s: %w", cfg.Stream, err))
	default:
		info := stream.CachedInfo()
		found = &info.Config
		if dropped, added := subjectsDiff(info.Config.Subjects, cfg.Subjects); cfg.CreateStream && (len(dropped) > 0 || len(added) > 0) {
			switch {
			case info.Config.Mirror != nil:
				problems = append(problems, Problem{Message: fmt.Sprintf("stream %s is a mirror, and run cannot set its subjects to nats.subjects, %s (create_stream: true)",
					cfg.Stream, strings.Join(cfg.Subjects, ", ")), Fix: "set nats.create_stream: false"})
			case len(dropped) > 0:
				problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("stream %s captures %s; run will set its subjects to nats.subjects, %s "+
					"(create_stream: true), and messages published to %s are no longer stored", cfg.Stream,
					strings.Join(info.Config.Subjects, ", "), strings.Join(cfg.Subjects, ", "), strings.Join(dropped, ", ")),
					Fix: "set nats.subjects to the stream's subjects, or nats.create_stream: false"})
			default:
				problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("stream %s captures %s; run will add %s (nats.subjects, create_stream: true)",
					cfg.Stream, cmp.Or(strings.Join(info.Config.Subjects, ", "), "no subjects of its own"), strings.Join(added, ", "))})
			}
		}
		if info.Config.Sealed && cfg.CreateStream {
			problems = append(problems, Problem{Warning: true, Message: sealedMessage(cfg.Stream)})
		}
		if limits := streamLimitsDiff(&info.Config, &cfg); cfg.CreateStream && !info.Config.Sealed && len(limits) > 0 {
			problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("run will set stream %s's %s (nats.stream_max_age, nats.stream_max_bytes, nats.stream_replicas, nats.stream_duplicate_window; "+
				"a lower max_age or max_bytes deletes events at once, stored by jetsink or not)", cfg.Stream, strings.Join(limits, ", "))})
		}
		limited := info.Config
		if cfg.CreateStream && !info.Config.Sealed {
			limited = withStreamKeys(limited, &cfg)
		}
		events = &limited
		problems = append(problems, eventStreamLimits(&limited, &cfg)...)
		if p, ok := replicaProblem(clusterOf(nc, &cfg), &limited); ok {
			problems = append(problems, p)
		}
		if cons, cerr := stream.Consumer(ctx, cfg.Consumer); cerr == nil {
			if p, ok := durableReplicaProblem(clusterOf(nc, &cfg), cfg.Stream, limited.Replicas, &cons.CachedInfo().Config); ok {
				problems = append(problems, p)
			}
			if p, ok := memoryDurableProblem(&cfg, &limited, &cons.CachedInfo().Config); ok {
				problems = append(problems, p)
			}
		}
		if err := checkNoLoop(cfg.Stream, info.Config.Subjects, cfg.DeadLetterSubject); err != nil {
			problems = append(problems, Problem{Config: true, Message: err.Error()}) // New refuses it: ErrInvalidConfig
		}
		if p, ok := filterProblem(&cfg, &info.Config); ok {
			problems = append(problems, p) // New refuses it too
		}
		problems = append(problems, checkConsumer(ctx, js, cfg, info.Config.Retention, info.State.FirstSeq)...)
		if cfg.StoredSeq != nil {
			stored, err := cfg.StoredSeq(ctx, cfg.Stream)
			if err == nil && info.State.LastSeq < stored {
				// The stream as it is now, after the table: read before
				// it, it misses the events a running jetsink stored
				// meanwhile, and would pass for restarted under them
				// (as Run's checkSeq reads them).
				if fresh, ferr := stream.Info(ctx); ferr == nil {
					info = fresh
				}
			}
			if err == nil {
				// A stream run refused before stays judged as a replacement.
				marked := false
				if cons, cerr := stream.Consumer(ctx, cfg.Consumer); cerr == nil {
					marked = cons.CachedInfo().Config.Metadata[replacedKey] == replacedMark(info.Created)
				}
				err = restarted(cfg.Stream, info, stored, stored, marked)
			}
			if err != nil {
				problems = append(problems, Problem{Message: "stream sequence against the table: " + err.Error()})
			}
		}
	}
	dlqName, err := js.StreamNameBySubject(ctx, cfg.DeadLetterSubject)
	if sourced := dlqName; found != nil && (err == nil || errors.Is(err, jetstream.ErrStreamNotFound) && cfg.CreateStream) {
		if err != nil {
			sourced = cfg.Stream + "_DLQ" // run will create it
		}
		if err := checkNoSourceLoop(found, sourced, cfg.DeadLetterSubject, cfg.FilterSubject); err != nil {
			problems = append(problems, Problem{Config: true, Message: err.Error()}) // New refuses it: ErrInvalidConfig
		}
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		p := Problem{Message: fmt.Sprintf("no stream captures nats.dead_letter_subject %s: events that cannot be stored would be nak'ed again and again instead of parked", cfg.DeadLetterSubject),
			Fix: fmt.Sprintf("create one, e.g. nats stream add %s --subjects %s --defaults, or set nats.create_stream: true", shellWord(cfg.Stream+"_DLQ"), shellWord(cfg.DeadLetterSubject))}
		if cfg.CreateStream {
			p = Problem{Warning: true, Message: fmt.Sprintf("no stream captures %s yet; run will create %s_DLQ (create_stream: true)", cfg.DeadLetterSubject, cfg.Stream)}
			if taken, err := js.Stream(ctx, cfg.Stream+"_DLQ"); err == nil {
				// Run's New fails to make it (the name is in use).
				p = deadLetterNameInUse(cfg.Stream+"_DLQ", cfg.DeadLetterSubject, taken.CachedInfo().Config.Subjects)
			}
		}
		problems = append(problems, p)
	} else if err != nil {
		return nil, apiDenialError(nc, &cfg, before, fmt.Errorf("look up the stream of nats.dead_letter_subject: %w", err))
	} else {
		// Its settings need STREAM.INFO on it, which an account that
		// may only publish dead letters lacks: run only warns of that too
		// (warnDeadLetterStream), so it is no reason to fail check.
		if dlq, err := js.Stream(ctx, dlqName); err != nil {
			problems = append(problems, Problem{Warning: true,
				Message: fmt.Sprintf("could not read the settings of dead-letter stream %s, so they are not checked: %v", dlqName, err),
				Fix:     fmt.Sprintf("allow %s to have them checked", apiSubjects(cfg, "STREAM.INFO."+dlqName))})
		} else {
			problems = append(problems, deadLetterStreamProblems(&dlq.CachedInfo().Config, events, cfg.AckWait, nc.MaxPayload())...)
		}
	}
	return problems, nil
}

// clearTextProblem is the warning of a connection nc that is not TLS to an
// address that is not loopback while cfg sends credentials: nats.go (and
// the wire client) use TLS with a nats:// URL only when the server's INFO
// asks for it, so the credentials (a password or token as is, a JWT, an
// NKey's signature) and the events cross the network in the clear. It is
// judged from the live connection: its TLS state, the URL it connected to
// (whose user info, if any, is what nats.go sent) and the address it
// reached (a name such as localhost resolved). Not loopback is all it can
// tell: this machine's own LAN or bridge address warns too, and so does a
// server behind a sidecar or tunnel that does TLS (a service mesh's mTLS),
// which makes the warning moot.
func clearTextProblem(nc *nats.Conn, cfg *Config) (Problem, bool) {
	connected := nc.ConnectedUrl()
	creds := sentCredentials(cfg, connected)
	if creds == "" {
		return Problem{}, false
	}
	if _, err := nc.TLSConnectionState(); !errors.Is(err, nats.ErrConnectionNotTLS) {
		return Problem{}, false // TLS, or no longer connected: nothing to judge
	}
	if u, err := url.Parse(connected); err == nil && u.Scheme == "wss" {
		return Problem{}, false // TLS beneath the websocket
	}
	host, _, err := net.SplitHostPort(nc.ConnectedAddr())
	if err != nil || !offLoopback(host) {
		return Problem{}, false
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("the connection to NATS at %s (%s, an address that is not loopback) is not TLS: %s and the events cross the network in the clear",
			serverOf(connected), host, creds),
		Fix: "use a tls:// URL in nats.url or set nats.tls.ca_file (either makes TLS mandatory; the server needs a tls block); " +
			"a sidecar or tunnel that does TLS on this connection (a service mesh's mTLS) makes this moot"}, true
}

// offLoopback is notLoopback; tests replace it to judge a server on
// 127.0.0.1 as one elsewhere.
var offLoopback = notLoopback

// notLoopback reports whether host, an IP address as net.SplitHostPort
// gives it (an IPv6 one perhaps with a zone: fe80::1%eth0), is one that
// is not loopback; false for what is no address (nothing to judge).
func notLoopback(host string) bool {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return !ip.WithZone("").Unmap().IsLoopback()
}

// sentCredentials names the credentials cfg has jetsink send to the
// server nats.go connected to (connected, its URL), "" for none. User
// info in nats.url counts only in the connected server's URL: nats.go
// sends each URL's own (and copies it to servers it learnt of, not to
// other configured ones).
func sentCredentials(cfg *Config, connected string) string {
	switch {
	case cfg.User != "" || cfg.Password != "":
		return "nats.user and nats.password"
	case cfg.CredsFile != "":
		return "the JWT of nats.creds_file and its signature"
	case cfg.NKeyFile != "":
		return "the NKey of nats.nkey_file and its signature"
	}
	if u, err := url.Parse(connected); err == nil && u.User != nil {
		return "the user info (a user and password, or a token) in nats.url"
	}
	return ""
}

// clusterOf is the name of the NATS cluster whose JetStream keeps the
// event stream, as far as the server nc is connected to tells: "" for a
// server on its own (a leaf node without a cluster block takes its own
// name for one), and when the stream is in another JetStream domain
// (nats.domain: the hub's, which this server does not describe).
func clusterOf(nc *nats.Conn, cfg *Config) string {
	if cfg.Domain != "" {
		return ""
	}
	if name := nc.ConnectedClusterName(); name != nc.ConnectedServerName() {
		return name
	}
	return ""
}

// replicaProblem is what is wrong with the replicas of event stream sc on
// cluster (clusterOf; "" for a server on its own): one replica on a
// cluster, a warning (the loss of that server's disk loses the events on
// it, acked to their publishers); more than one on a server on its own,
// an error (the server refuses such a stream).
func replicaProblem(cluster string, sc *jetstream.StreamConfig) (Problem, bool) {
	switch {
	case cluster == "" && sc.Replicas > 1:
		return Problem{Message: fmt.Sprintf("stream %s is to have %d replicas, but the server runs JetStream on its own, not in a cluster: it refuses such a stream", sc.Name, sc.Replicas),
			Fix: "set nats.stream_replicas to 0 or 1, or connect to a JetStream cluster"}, true
	case cluster != "" && sc.Replicas <= 1:
		return Problem{Warning: true,
			Message: fmt.Sprintf("stream %s has one replica on NATS cluster %s: losing that server's disk loses the events on it, acked to their publishers", sc.Name, cluster),
			Fix:     "keep it on three servers: nats.stream_replicas: 3 with create_stream, or " + streamEdit(sc.Name, "--replicas 3")}, true
	}
	return Problem{}, false
}

// durableReplicaProblem warns of durable cc with fewer replicas than its
// stream's (streamReplicas) on cluster (clusterOf; "" for a server on its
// own: nothing to warn of). A durable's 0 means the stream's. run keeps a
// durable's replicas (made by an operator so, or edited since): while the
// server holding it is down jetsink consumes nothing although the stream
// keeps its quorum, and losing that server's disk loses the consumer's ack
// floor.
func durableReplicaProblem(cluster, stream string, streamReplicas int, cc *jetstream.ConsumerConfig) (Problem, bool) {
	if cluster == "" || cc.Replicas < 1 || cc.Replicas >= streamReplicas {
		return Problem{}, false
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("consumer %s has %d replicas, fewer than stream %s's %d on NATS cluster %s: while a server holding it is down "+
			"jetsink consumes nothing, although the stream keeps its quorum, and losing its disk loses the consumer's ack floor (run keeps a durable's replicas)",
			cc.Durable, cc.Replicas, stream, streamReplicas, cluster),
		Fix: fmt.Sprintf("nats consumer edit %s %s --replicas %d --force", shellWord(stream), shellWord(cc.Durable), streamReplicas)}, true
}

// memoryDurableProblem warns of durable cc kept in memory (mem_storage)
// on cfg's event stream sc, kept on file: a restart of the server holding
// it (of all of them at once, in a cluster: a host rebooted) loses it,
// which the stream survives, and the jetsink started after makes it anew
// from the start of the stream (one running makes it again past the ack
// floor it last knew), storing again, in at-least-once mode, every event
// the stream holds; on a stream with interest retention, the events
// published until then are not stored. run keeps a durable's storage (no
// update changes it), so the fix is to make it again on file, past its
// ack floor. Not on a work-queue stream: the events acked are deleted
// there, and a durable made anew delivers those left.
func memoryDurableProblem(cfg *Config, sc *jetstream.StreamConfig, cc *jetstream.ConsumerConfig) (Problem, bool) {
	if !cc.MemoryStorage || sc.Storage != jetstream.FileStorage || sc.Retention == jetstream.WorkQueuePolicy {
		return Problem{}, false
	}
	interest := sc.Retention == jetstream.InterestPolicy
	msg := fmt.Sprintf("consumer %s keeps its state in memory (mem_storage), its stream %s on file: a restart of its server (in a cluster, "+
		"of all of them at once) loses the durable and its ack floor, and a jetsink started after that makes it anew from the start of the stream, "+
		"so in at-least-once mode every event the stream holds is stored again (run keeps a durable's storage: the server lets no update change it)",
		cfg.Consumer, cfg.Stream)
	if interest {
		msg += "; with the stream's interest retention, the events published until the durable is made again are not stored"
	}
	return Problem{Warning: true, Message: msg,
		Fix: remakeDurable(cfg, sc.Retention, "on file", "natscli makes a consumer on file unless told --memory")}, true
}

// remakeDurable says how to make cfg's durable again, as the server lets
// no update do, on its event stream of retention: past its ack floor, with
// the hold consumer first on an interest stream; deleted and made by
// jetsink on a work-queue stream, which refuses any start but all and
// deleted the events acked. how is what the remake changes ("on file"),
// why the natscli command does (in parentheses).
func remakeDurable(cfg *Config, retention jetstream.RetentionPolicy, how, why string) string {
	rm := fmt.Sprintf("nats consumer rm %s %s --force", shellWord(cfg.Stream), shellWord(cfg.Consumer))
	if retention == jetstream.WorkQueuePolicy {
		return fmt.Sprintf("stop jetsink, delete the durable (%s) and start jetsink, which makes it %s: on a work-queue stream it delivers "+
			"from the first event not acknowledged, those acknowledged being deleted", rm, how)
	}
	return fmt.Sprintf("stop jetsink and make the durable again past its ack floor, %s%s: %s, then %s (%s; jetsink keeps where it starts "+
		"and sets the rest)%s", how, floorWhere(cfg, floorPlaceholder), rm, consumerAdd(cfg.Stream, cfg.Consumer, cfg.FilterSubject, floorPlaceholder),
		why, holdFirst(cfg, floorPlaceholder, retention == jetstream.InterestPolicy))
}

// pullsWaiting is how many pull requests of one jetsink may wait on the
// server at once, as its pull clients keep them (consumer/wire's Sub and
// nats.go's Consume alike): the one being filled, and the next, asked
// for once fewer than half of the first's messages are outstanding; for a
// moment a third, a pull renewed before the server dropped the one it
// replaces. As measured, 30,000 events on one jetsink: 0.2 s with the
// durable's max_waiting at 3 or more, with either client; 10-12 s at 1
// (the server refuses the second pull, and the client waits for the
// first to end); at 2, 0.2 s mostly, 4.2 s once with nats.go.
const pullsWaiting = 3

// maxWaitingProblem warns of durable cc whose max_waiting, which jetsink
// keeps (the server lets no update change it), is below pullsWaiting, on
// cfg's event stream of retention: the server refuses jetsink's pulls
// beyond it, each refused one waiting out the one before, and the
// throughput falls many times over, with nothing failing. Instances
// sharing the durable need pullsWaiting each.
func maxWaitingProblem(cfg *Config, retention jetstream.RetentionPolicy, cc *jetstream.ConsumerConfig) (Problem, bool) {
	if cc.MaxWaiting <= 0 || cc.MaxWaiting >= pullsWaiting {
		return Problem{}, false
	}
	how := fmt.Sprintf("with max_waiting %d or more for each jetsink sharing it", pullsWaiting)
	if retention == jetstream.WorkQueuePolicy {
		how = "with the server's default max_waiting, 512" // jetsink sets none
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("consumer %s has max_waiting %d: the server keeps no more of its pull requests waiting at once, and each jetsink "+
			"keeps up to %d waiting, so it refuses jetsink's next pull until one ends, and events come many times slower (measured at 1: 30 to 70 times), "+
			"with nothing failing (run keeps a durable's max_waiting: the server lets no update change it)", cfg.Consumer, cc.MaxWaiting, pullsWaiting),
		Fix: remakeDurable(cfg, retention, how, "natscli leaves max_waiting to the server's default, 512, unless told --max-waiting")}, true
}

// eventStreamLimits warns of the limits under which the event stream sc
// deletes events whether jetsink has stored them or not (max_age; a limit
// with discard old): harmless while jetsink keeps up, a loss when
// PostgreSQL is down, or jetsink stopped, for longer than they allow; and
// of the publishers' deletions it allows (publisherDeletions), of its
// interest retention and consumer_limits.inactive_threshold; and reports,
// as an error, a consumer_limits.max_ack_pending below jetsink's
// (ackPendingLimitProblem).
func eventStreamLimits(sc *jetstream.StreamConfig, cfg *Config) []Problem {
	problems := publisherDeletions(sc)
	if p, ok := interestProblem(sc, cfg); ok {
		problems = append(problems, p)
	}
	if p, ok := inactiveLimitProblem(sc); ok {
		problems = append(problems, p)
	}
	if p, ok := ackPendingLimitProblem(sc, cfg); ok {
		problems = append(problems, p)
	}
	var limits []string
	if sc.MaxAge > 0 {
		limits = append(limits, "max_age "+sc.MaxAge.String())
	}
	limits = append(limits, discardingLimits(sc)...)
	if len(limits) == 0 {
		return problems
	}
	return append([]Problem{{Warning: true, Message: fmt.Sprintf("stream %s deletes events past %s whether jetsink has stored them or not: "+
		"those not stored by then (PostgreSQL down, or jetsink stopped, for longer) are lost", sc.Name, strings.Join(limits, ", ")),
		Fix: "choose limits beyond the longest outage to ride out, or none (discard new: a full stream refuses publishes instead)"}}, problems...)
}

// interestProblem is the warning for event stream sc when it has interest
// retention (ok false otherwise): the server keeps an event only while a
// consumer on the stream has not acknowledged it, and stores none
// published while no consumer is on the stream (nats-server's
// processJetStreamMsg skips them), so deleting jetsink's durable consumer,
// which jetsink's own fixes elsewhere advise (holdFirst), deletes every event it
// has not acknowledged (all of them when it is the only consumer: the
// stream is emptied), and loses the events published before it is made
// again. Run logs it at the start too. cfg is jetsink's (its durable and
// filter, for holdSteps).
func interestProblem(sc *jetstream.StreamConfig, cfg *Config) (p Problem, ok bool) {
	if sc.Retention != jetstream.InterestPolicy {
		return Problem{}, false
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("stream %s has interest retention: it keeps an event only until every consumer on the stream has acknowledged it, "+
			"and stores none published while no consumer is on it; deleting jetsink's durable consumer (nats consumer rm) deletes every event "+
			"it has not acknowledged that no other consumer still holds (with no other consumer: all of them, the stream is emptied), "+
			"and the events published before the durable is made again are not stored", sc.Name),
		Fix: "before deleting the durable consumer (to move it past an event, or as another fix says), " + holdSteps(cfg, floorPlaceholder) +
			"; or have jetsink read a stream with limits retention"}, true
}

// inactiveLimitProblem is the warning for event stream sc when it has a
// consumer_limits.inactive_threshold (ok false otherwise): the server
// gives it to a consumer that sets none, as jetsink's durable does
// (nats-server's setConsumerConfigDefaults), and refuses one above it, so
// jetsink cannot take it off; and it deletes a pull consumer no pull has
// come to for that long (deleteNotActive): the durable, once jetsink has
// been stopped longer, or has run pulling nothing (Run's pause while
// PostgreSQL is unreachable). The next start makes it anew from the start
// of the stream (at-least-once: every event the stream holds stored
// again); Run, still running, makes it again past its ack floor. On a
// stream with interest retention, deleting the durable deletes the events
// it has not acknowledged (interestProblem): lost. Run logs it at the
// start too. natscli sets the limit only at nats stream add
// (--limit-consumer-inactive): nats stream edit has no flag for it.
func inactiveLimitProblem(sc *jetstream.StreamConfig) (p Problem, ok bool) {
	limit := sc.ConsumerLimits.InactiveThreshold
	if limit <= 0 {
		return Problem{}, false
	}
	lost := ""
	if sc.Retention == jetstream.InterestPolicy {
		lost = "; and this stream has interest retention: deleting the durable deletes every event it has not acknowledged " +
			"that no other consumer holds, which are lost, never stored"
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("stream %s has consumer_limits.inactive_threshold %v, which the server gives jetsink's durable consumer (jetsink sets none, "+
			"and cannot take it off: the server refuses a longer one): the server deletes the durable once no pull has come for longer than that, "+
			"so once jetsink has been stopped longer, and the next start makes it anew from the start of the stream, storing again every event "+
			"the stream holds (at-least-once), or while PostgreSQL is unreachable for longer (jetsink pulls nothing then)%s", sc.Name, limit, lost),
		Fix: fmt.Sprintf("remove the limit: set the stream's consumer_limits.inactive_threshold to 0 (natscli's stream edit has no flag for it: "+
			"edit the configuration with %s, or --config <a file of it>); or never stop jetsink, "+
			"nor leave PostgreSQL unreachable, for that long", streamEdit(sc.Name, "--interactive"))}, true
}

// ackPendingLimitProblem is the error for event stream sc when its
// consumer_limits.max_ack_pending is below jetsink's (cfg.maxAckPending;
// ok false otherwise): the server refuses to make or update a consumer
// asking for more (nats-server's checkConsumerCfg, err_code 10121), so
// New fails, and so does every re-creation of the consumer inside Run.
func ackPendingLimitProblem(sc *jetstream.StreamConfig, cfg *Config) (p Problem, ok bool) {
	limit, want := sc.ConsumerLimits.MaxAckPending, cfg.maxAckPending()
	if limit <= 0 || want <= 0 || want <= limit {
		return Problem{}, false
	}
	return Problem{
		Message: fmt.Sprintf("stream %s has consumer_limits.max_ack_pending %d, below jetsink's max_ack_pending %d: the server refuses to make or update "+
			"jetsink's durable consumer with it, so run fails at its start, and a run under way cannot make the consumer again (as it does to resubscribe)",
			sc.Name, limit, want),
		Fix: fmt.Sprintf("set nats.max_ack_pending to %d or less, or remove the stream's limit (set its consumer_limits.max_ack_pending to 0: "+
			"%s, or --config <a file of it>)", limit, streamEdit(sc.Name, "--interactive"))}, true
}

// accountAckPendingProblem is the error when the account's JetStream
// limit max_ack_pending (limit; 0 or less: none) is below jetsink's: the
// server refuses the durable as for the stream's (ackPendingLimitProblem).
// The servers' own jetstream limits refuse it too, but no client request
// shows them: New's error names them (ackPendingExcessFix).
func accountAckPendingProblem(limit int, cfg *Config) (p Problem, ok bool) {
	want := cfg.maxAckPending()
	if limit <= 0 || want <= 0 || want <= limit {
		return Problem{}, false
	}
	return Problem{
		Message: fmt.Sprintf("the account's JetStream limit max_ack_pending is %d, below jetsink's max_ack_pending %d: the server refuses to make or update "+
			"jetsink's durable consumer with it, so run fails at its start, and a run under way cannot make the consumer again (as it does to resubscribe)",
			limit, want),
		Fix: fmt.Sprintf("set nats.max_ack_pending to %d or less, or raise the account's limit (max_ack_pending in the account's jetstream block of "+
			"the server's configuration, or in its JWT)", limit)}, true
}

// holdSteps says how to keep the events of interest stream cfg.Stream
// while jetsink's durable consumer is deleted and made again: a consumer
// that acknowledges nothing, from deliver (the durable's ack floor's
// stream sequence + 1: deliverAfter, or floorPlaceholder) on, added first
// and removed after.
func holdSteps(cfg *Config, deliver string) string {
	return fmt.Sprintf("first add a consumer that holds the events it has not acknowledged: %s%s, and remove it (nats consumer rm %s jetsink_hold --force) "+
		"once the durable is there again (until then the stream keeps every event)",
		consumerAdd(cfg.Stream, "jetsink_hold", cfg.FilterSubject, deliver), floorWhere(cfg, deliver), shellWord(cfg.Stream))
}

// holdFirst is what to add to a fix that deletes the durable consumer of
// event stream cfg.Stream when it has interest retention
// (interestProblem): "" when it has not. deliver is as holdSteps'.
func holdFirst(cfg *Config, deliver string, interest bool) string {
	if !interest {
		return ""
	}
	return "; stream " + cfg.Stream + " has interest retention, where deleting the durable deletes the events it has not acknowledged: " + holdSteps(cfg, deliver)
}

// floorPlaceholder is the --deliver of a consumer made past the durable's
// ack floor when the floor is not at hand (deliverAfter when it is): nats
// consumer info prints the floor as "Consumer sequence: X Stream
// sequence: Y", the consumer's first, and --deliver takes a stream
// sequence. They differ: X > Y on a stream with redeliveries (X + 1
// skips events), X < Y for a filtered durable.
const floorPlaceholder = "<the ack floor's stream sequence + 1>"

// deliverAfter is the --deliver of a consumer made past ack floor floor
// (a consumer info's AckFloor.Stream).
func deliverAfter(floor uint64) string {
	return strconv.FormatUint(floor+1, 10)
}

// floorWhere says where to read the ack floor for a deliver of
// floorPlaceholder, "" for a number.
func floorWhere(cfg *Config, deliver string) string {
	if deliver != floorPlaceholder {
		return ""
	}
	return fmt.Sprintf(" (nats consumer info %s %s shows the durable's ack floor: take its stream sequence, not its consumer sequence, printed first)",
		shellWord(cfg.Stream), shellWord(cfg.Consumer))
}

// consumerAdd is the natscli command that adds durable name on stream,
// an explicit-ack pull consumer of filter ("" for every subject)
// delivering from stream sequence deliver on. Without --replay and
// --defaults natscli asks for the replay policy and the rest, and fails
// with no terminal ("could not ask replay policy"); at one, replay
// original makes a durable no update can change.
func consumerAdd(stream, name, filter, deliver string) string {
	cmd := "nats consumer add " + shellWord(stream) + " " + shellWord(name) + " --pull --ack explicit --deliver " + deliver + " --replay instant"
	if filter != "" {
		cmd += " --filter " + shellWord(filter)
	}
	return cmd + " --defaults"
}

// streamEdit is the natscli command that edits stream with flags. Without
// --force natscli shows the change and asks "Really edit Stream", and
// fails with no terminal (natscli's cli/stream_command.go: strEdit's
// Flag("force", "Force edit without prompting")).
func streamEdit(stream, flags string) string {
	return "nats stream edit " + shellWord(stream) + " --force " + flags
}

// shellWord is s as one word of a POSIX shell's command line: as it is
// when it holds nothing a shell reads specially, else in single quotes (a
// subject's wildcards > and * redirect and glob).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/=@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// publisherDeletions warns of the settings of event stream sc under which
// a publisher's header deletes events whether jetsink has stored them or
// not: allow_msg_ttl (Nats-TTL deletes its own event that long after it
// was stored, even before jetsink was handed it) and allow_rollup_hdrs
// (Nats-Rollup: sub or all deletes the subject's or the stream's earlier
// events; on for a key-value bucket's stream, whose purges need it and
// get their own warning, and with subject delete markers or message
// schedules; the server refuses it with deny_purge). They
// are the publishers' to use, so run logs them at the start too (check
// alone warns of the limits, which the operator set).
func publisherDeletions(sc *jetstream.StreamConfig) []Problem {
	var problems []Problem
	if sc.AllowMsgTTL {
		problems = append(problems, Problem{Warning: true,
			Message: fmt.Sprintf("stream %s allows per-message TTLs (allow_msg_ttl): an event published with a Nats-TTL header is deleted when it runs out whether jetsink has stored it or not: "+
				"one with a TTL shorter than jetsink's lag (PostgreSQL down, or jetsink stopped, for longer) is lost", sc.Name),
			Fix: "have publishers set no Nats-TTL on events for jetsink, or one beyond the longest outage to ride out (the server cannot turn allow_msg_ttl off)"})
	}
	if bucket, ok := kvBucket(sc); ok && sc.AllowRollup {
		// The bucket needs roll-ups (a purge is one): turning them off
		// would break it, not protect the events.
		problems = append(problems, Problem{Warning: true,
			Message: fmt.Sprintf("stream %s is key-value bucket %s's, which allows roll-ups (allow_rollup_hdrs) for its purges: a purge of a key (nats kv purge, KeyValue.Purge) deletes the key's earlier revisions whether jetsink has stored them or not: "+
				"those not stored by then (PostgreSQL down, or jetsink stopped, when it came) are lost", sc.Name, bucket),
			Fix: fmt.Sprintf("keep jetsink's lag short, or keep the history in a stream that sources %s without allow_rollup_hdrs (a purge copied there deletes nothing) and have jetsink read that; leave roll-ups on: the bucket's purges need them", sc.Name)})
	} else if sc.AllowRollup {
		problems = append(problems, Problem{Warning: true,
			Message: fmt.Sprintf("stream %s allows roll-ups (allow_rollup_hdrs): an event published with a Nats-Rollup header (sub or all; a key-value bucket's purge sends one) deletes its subject's or the stream's earlier events whether jetsink has stored them or not: "+
				"those not stored by then are lost", sc.Name),
			Fix: fmt.Sprintf("have publishers send no Nats-Rollup to subjects jetsink reads, or turn roll-ups off (%s; subject delete markers and message schedules keep them on)", streamEdit(sc.Name, "--no-allow-rollup"))})
	}
	return problems
}

// kvBucket reports whether sc is a key-value bucket's stream, as nats.go
// and the nats CLI make one: named KV_<bucket>, with the subjects
// $KV.<bucket>.> (or none, mirroring another bucket's stream), and
// returns the bucket's name.
func kvBucket(sc *jetstream.StreamConfig) (string, bool) {
	bucket, ok := strings.CutPrefix(sc.Name, "KV_")
	if !ok || bucket == "" {
		return "", false
	}
	if len(sc.Subjects) == 0 {
		return bucket, sc.Mirror != nil && strings.HasPrefix(sc.Mirror.Name, "KV_")
	}
	return bucket, len(sc.Subjects) == 1 && sc.Subjects[0] == "$KV."+bucket+".>"
}

// discardingLimits describes sc's limits that delete its oldest messages
// once reached ("max_bytes 1073741824"): max_msgs and max_bytes with
// discard old, and max_msgs_per_subject, which drops the subject's oldest
// message even with discard new unless discard_new_per_subject is set.
func discardingLimits(sc *jetstream.StreamConfig) []string {
	var limits []string
	if sc.Discard == jetstream.DiscardOld {
		if sc.MaxMsgs > 0 {
			limits = append(limits, fmt.Sprintf("max_msgs %d", sc.MaxMsgs))
		}
		if sc.MaxBytes > 0 {
			limits = append(limits, fmt.Sprintf("max_bytes %d", sc.MaxBytes))
		}
	}
	if sc.MaxMsgsPerSubject > 0 && (sc.Discard != jetstream.DiscardNew || !sc.DiscardNewPerSubject) {
		limits = append(limits, fmt.Sprintf("max_msgs_per_subject %d", sc.MaxMsgsPerSubject))
	}
	return limits
}

// filterProblem is the Problem of a nats.filter_subject that matches none
// of the subjects stream sc stores: the server takes such a filter, and the
// consumer then receives nothing, silently. A stream with a subject
// transform stores what its source takes in its destination's form
// (storedSubjects): a filter on the form captured matches nothing there.
// A stream that stores any subject (a mirror, or one that sources others)
// is not judged.
func filterProblem(cfg *Config, sc *jetstream.StreamConfig) (p Problem, ok bool) {
	f := cfg.FilterSubject
	if f == "" || len(sc.Subjects) == 0 || sc.Mirror != nil || len(sc.Sources) > 0 {
		return Problem{}, false
	}
	stored := storedSubjects(sc)
	if slices.ContainsFunc(stored, func(s string) bool { return pipeline.SubjectsOverlap(s, f) }) {
		return Problem{}, false
	}
	what := fmt.Sprintf("stream %s's subjects (%s)", cfg.Stream, strings.Join(sc.Subjects, ", "))
	if t := sc.SubjectTransform; t != nil && t.Destination != "" {
		what = fmt.Sprintf("the subjects stream %s stores (%s: its subject_transform stores %s as %s)", cfg.Stream,
			strings.Join(stored, ", "), cmp.Or(t.Source, ">"), t.Destination)
	}
	return Problem{Config: true, Message: fmt.Sprintf("nats.filter_subject %q matches none of %s: the consumer would receive nothing", f, what),
		Fix: "set nats.filter_subject to a subject within the stream's as it stores them, or \"\" for all"}, true
}

// storedSubjects is the subjects stream sc stores messages under: those
// it captures, but for what its subject transform's source takes, which it
// stores in the transform's destination form (storedPattern; a
// mapping function's token as "*"). A captured subject wholly within the
// source is stored only so; one that overlaps it, both ways.
func storedSubjects(sc *jetstream.StreamConfig) []string {
	t := sc.SubjectTransform
	if t == nil || t.Destination == "" {
		return sc.Subjects
	}
	src := cmp.Or(t.Source, ">")
	var out []string
	for _, s := range sc.Subjects {
		if pipeline.SubjectsOverlap(s, src) {
			out = append(out, storedPattern(t.Destination))
			if subjectWithin(s, src) {
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// storedPattern is the subjects (a pattern) a subject transform to dest
// stores messages under, for a judgement of what a filter or a dead-letter
// loop may meet: dest with each token that holds a mapping function or a
// $n reference taken as "*", and, from a token with a split or slice
// function on (it may make several tokens of one), ">". Too wide a guess
// only lets a filter pass or refuses a loop that may be there.
func storedPattern(dest string) string {
	tokens := strings.Split(dest, ".")
	for i, t := range tokens {
		l := strings.ToLower(t)
		if strings.Contains(l, "{{") && (strings.Contains(l, "split") || strings.Contains(l, "slice")) {
			return strings.Join(append(tokens[:i:i], ">"), ".")
		}
		if strings.Contains(t, "{{") || strings.HasPrefix(t, "$") {
			tokens[i] = "*"
		}
	}
	return strings.Join(tokens, ".")
}

// deadLetterStreamProblems judges sc, the stream that captures the
// dead-letter subject: settings under which it deletes dead letters that
// nobody has seen (max_age; a limit with discard old; interest or
// work-queue retention), never answers a publish (no_ack), refuses the
// letter of an event of the largest size (a max_msg_size below that size
// and deadLetterHeadroom, within maxPayload; the largest event is the
// event stream's max_msg_size, or else maxPayload, the server's), or
// stores the
// dead letter of an event that comes back after nats.ack_wait twice (a
// duplicate window below deadLetterDuplicates(ackWait)). Check reports them; New (and
// Run, when it makes the streams again) logs them. Warnings all: jetsink
// runs, but letters may go.
func deadLetterStreamProblems(sc, events *jetstream.StreamConfig, ackWait time.Duration, maxPayload int64) []Problem {
	var problems []Problem
	warn := func(msg, fix string) {
		problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("dead-letter stream %s %s", sc.Name, msg), Fix: fix})
	}
	// The server refuses a message over a stream's max_msg_size (API error
	// 10054), a dead letter too: its event is then nak'ed again and again.
	if sc.MaxMsgSize > 0 {
		largest, of := maxPayload, fmt.Sprintf("the server's max_payload %d", maxPayload)
		if events != nil && events.MaxMsgSize > 0 && (int64(events.MaxMsgSize) < largest || largest <= 0) {
			largest, of = int64(events.MaxMsgSize), fmt.Sprintf("event stream %s's max_msg_size %d", events.Name, events.MaxMsgSize)
		}
		need := largest + deadLetterHeadroom
		if maxPayload > 0 {
			need = min(need, maxPayload) // fitReason shortens a letter over it
		}
		if largest > 0 && int64(sc.MaxMsgSize) < need {
			warn(fmt.Sprintf("has max_msg_size %d, less than the %d bytes a dead letter of the largest event may take (%s, plus %d for jetsink's headers): "+
				"it refuses such a letter, and its event is nak'ed again and again", sc.MaxMsgSize, need, of, deadLetterHeadroom),
				fmt.Sprintf("raise its max_msg_size to %d or more, or -1 for none (%s)", need, streamEdit(sc.Name, fmt.Sprintf("--max-msg-size %d", need))))
		}
	}
	// A dead letter is the only copy of an event terminated in the event
	// stream: it should be kept as safely as the events are.
	if events != nil {
		if have, want := max(sc.Replicas, 1), max(events.Replicas, 1); have < want {
			warn(fmt.Sprintf("has %d replicas, fewer than event stream %s's %d: a dead letter is the only copy of its event, and losing servers the event stream survives may lose it",
				have, events.Name, want),
				fmt.Sprintf("raise its replicas to %d (%s)", want, streamEdit(sc.Name, fmt.Sprintf("--replicas %d", want))))
		}
		if sc.Storage == jetstream.MemoryStorage && events.Storage == jetstream.FileStorage {
			warn(fmt.Sprintf("keeps its dead letters in memory: a restart of its servers loses them, the only copies of events terminated in file-backed stream %s", events.Name),
				"create it again with file storage (a stream's storage cannot be changed)")
		}
	}
	if sc.MaxAge > 0 {
		warn(fmt.Sprintf("has max_age %s: it deletes a dead letter that long after storing it, replayed or not", sc.MaxAge),
			"set its max_age to 0 (unlimited), and delete letters once dealt with (jetsink dlq replay does)")
	}
	if limits := discardingLimits(sc); len(limits) > 0 {
		warn(fmt.Sprintf("has %s: once a limit is reached it deletes its oldest dead letters, silently (discard old)", strings.Join(limits, ", ")),
			"remove the limits, or set discard new (and discard_new_per_subject for max_msgs_per_subject): a full stream then refuses "+
				"dead letters, and their events are nak'ed and kept in the event stream")
	}
	switch sc.Retention {
	case jetstream.InterestPolicy:
		warn("has interest retention: it deletes a dead letter once every consumer on it has acknowledged it, at once when there is none",
			"use a stream with limits retention for the dead-letter subject")
	case jetstream.WorkQueuePolicy:
		warn("has work-queue retention: it deletes a dead letter as soon as a consumer acknowledges it",
			"use a stream with limits retention for the dead-letter subject")
	}
	if sc.NoAck {
		warn("has no_ack set: it answers no publish, so every dead letter times out and its event is nak'ed again and again",
			"set its no_ack to false")
	}
	if want := deadLetterDuplicates(ackWait); sc.Duplicates < want {
		warn(fmt.Sprintf("has a duplicate_window of %s, less than twice nats.ack_wait %s: the dead letter of a poison event that comes back "+
			"(its term lost) is published again ack_wait plus its wait in jetsink after the first, and may then be stored twice", sc.Duplicates, ackWait),
			fmt.Sprintf("set its duplicate_window to %s (twice nats.ack_wait) or more", want))
	}
	return problems
}

// deadLetterHeadroom is what a dead letter may take beyond its event's
// body and headers, as deadLetterStreamProblems judges a dead-letter
// stream's max_msg_size: jetsink's headers (Jetsink-Reason and
// Jetsink-Omitted-Headers up to MaxReasonLen each, the subject, stream,
// consumer and ids; a subject of more than a few hundred bytes needs more).
const deadLetterHeadroom = 2 << 10

// deadLetterDuplicates is the least duplicate window of a dead-letter
// stream: twice ackWait. The dead letter of an event that comes back, its
// term lost, is published ack_wait after the first and then as long again
// as the event waits in jetsink (its ring, the sink's batch) before it is
// dead-lettered, which the second ack_wait allows for. jetsink makes
// <stream>_DLQ with this window, or the server's default 2 minutes when
// that is longer (deadLetterStreamConfig).
func deadLetterDuplicates(ackWait time.Duration) time.Duration {
	return 2 * ackWait
}

// durableInfo reads the info of consumer name on stream, a pull or a push
// consumer: nats.go (v1.55) looks a consumer up only as one kind, and gives
// no pull handle on a push consumer (jetstream.ErrNotPullConsumer), whose
// configuration still says what it is (foreignDurableProblem refuses it).
// It returns nats.go's errors unwrapped: jetstream.ErrConsumerNotFound,
// jetstream.ErrStreamNotFound, or the request's.
func durableInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	cons, err := js.Consumer(ctx, stream, name)
	if err == nil {
		return cons.CachedInfo(), nil
	}
	if !errors.Is(err, jetstream.ErrNotPullConsumer) {
		return nil, err
	}
	push, err := js.PushConsumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return push.CachedInfo(), nil
}

// checkConsumer compares an existing durable consumer with the config;
// retention is the event stream's (holdFirst, remakeDurable), firstSeq
// its first sequence (widenedFilterSteps).
func checkConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, retention jetstream.RetentionPolicy, firstSeq uint64) []Problem {
	interest := retention == jetstream.InterestPolicy
	info, err := durableInfo(ctx, js, cfg.Stream, cfg.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		look, err := siblings(ctx, js, &cfg)
		switch {
		case err != nil:
			msg := fmt.Sprintf("durable consumer %s does not exist yet; run will create it, from the start of the stream; "+
				"could not look for other durable consumers of this destination, whose events it would store again: %v", cfg.Consumer, err)
			if cfg.StoredSeq == nil && !lookBarred(err) {
				// lookForSiblings refuses at New.
				msg += "; run looks again first, and, should that look fail too, does not create it but exits non-zero, to be started again"
			}
			return []Problem{{Warning: true, Message: msg, Fix: lookFix(&cfg, err)}}
		case len(look.found) > 0:
			return []Problem{siblingProblem(&cfg, look, cfg.StoredSeq != nil, interest, false)}
		case look.cut:
			return []Problem{unseenSiblingsProblem(&cfg, false)}
		}
		return []Problem{{Warning: true, Message: fmt.Sprintf("durable consumer %s does not exist yet; run will create it", cfg.Consumer)}}
	}
	if err != nil {
		return []Problem{{Message: fmt.Sprintf("look up consumer %s: %v", cfg.Consumer, err)}}
	}
	cc := info.Config
	if p, ok := foreignDurableProblem(cfg.Consumer, &cc); ok {
		// Run refuses it (exit 2): nothing else about it matters.
		p.Fix += holdFirst(&cfg, floorPlaceholder, interest)
		return []Problem{p}
	}
	var problems []Problem
	if v := cc.Metadata[strandedKey]; v != "" {
		problems = append(problems, strandedProblem(v))
	}
	if p, ok := replayOriginalProblem(cfg.Consumer, &cc); ok {
		p.Fix += holdFirst(&cfg, floorPlaceholder, interest)
		problems = append(problems, p)
	}
	if p, ok := destinationProblem(cfg.Consumer, cc.Metadata[destinationKey], cfg.Destination); ok {
		problems = append(problems, p)
	}
	if p, ok := maxWaitingProblem(&cfg, retention, &cc); ok {
		problems = append(problems, p)
	}
	if cc.AckWait != cfg.AckWait || cc.MaxDeliver != durableMaxDeliver || !sameFilter(&cc, cfg.FilterSubject) || len(cc.BackOff) > 0 {
		filter := strconv.Quote(cc.FilterSubject)
		if len(cc.FilterSubjects) > 0 {
			filter = fmt.Sprintf("%q", cc.FilterSubjects)
		}
		msg := fmt.Sprintf("consumer %s has ack_wait %s, max_deliver %d, filter %s", cfg.Consumer, cc.AckWait, cc.MaxDeliver, filter)
		if len(cc.BackOff) > 0 {
			msg += fmt.Sprintf(", backoff %v", cc.BackOff)
		}
		msg += fmt.Sprintf("; run will update it to %s, %s, %q", cfg.AckWait, describeMaxDeliver(cfg.MaxDeliver), cfg.FilterSubject)
		if len(cc.BackOff) > 0 {
			msg += ", no backoff"
		}
		p := Problem{Warning: true, Message: msg}
		if !sameFilter(&cc, cfg.FilterSubject) {
			p.Fix = "the consumer keeps its place in the stream when its filter changes: events on subjects the new filter adds " +
				"that lie before that place are not delivered"
			if filterTakesMore(&cc, cfg.FilterSubject) {
				p.Fix += " (its place: " + placeText(info) + "); " + widenedFilterSteps(&cfg, interest, firstSeq)
			}
		}
		problems = append(problems, p)
	}
	if why := pullLimits(cc, &cfg); why != "" {
		// Set on the consumer (an edit), run sets it back; filled in
		// by the server's jetstream limits, run cannot, and exits 2.
		// Which of the two the consumer's info does not say.
		problems = append(problems, Problem{Warning: true, Message: fmt.Sprintf("consumer %s refuses jetsink's pulls: %s; run clears the "+
			"consumer's own limits, but if the server's jetstream limits set them, run stops with this error (exit 2)", cfg.Consumer, why)})
	}
	return problems
}

// foreignDurableProblem is the Problem of durable consumer name (cc, as
// the server has it) when it is not an explicit-ack pull consumer: the
// server lets no update change a consumer's ack policy or make a push
// consumer a pull one, so jetsink cannot use it, and New refuses it as a
// bad nats.consumer (ErrInvalidConfig) before asking the server to. ok is
// false for a consumer jetsink can take.
func foreignDurableProblem(name string, cc *jetstream.ConsumerConfig) (p Problem, ok bool) {
	var kind []string
	switch cc.AckPolicy {
	case jetstream.AckExplicitPolicy:
	case jetstream.AckNonePolicy:
		kind = append(kind, "ack policy none")
	case jetstream.AckAllPolicy:
		kind = append(kind, "ack policy all")
	default:
		kind = append(kind, fmt.Sprintf("ack policy %d", cc.AckPolicy))
	}
	if cc.DeliverSubject != "" {
		kind = append(kind, "a push consumer delivering to "+cc.DeliverSubject)
	}
	if len(kind) == 0 {
		return Problem{}, false
	}
	return Problem{Config: true, Message: fmt.Sprintf("consumer %s is not an explicit-ack pull consumer (%s), and a consumer's kind cannot be changed",
		name, strings.Join(kind, ", ")), Fix: "delete it (nats consumer rm) or choose another nats.consumer"}, true
}

// replayOriginalProblem is the warning for durable consumer name (cc, as
// the server has it) when its replay policy is original, which jetsink
// keeps (consumerConfig); ok is false otherwise.
func replayOriginalProblem(name string, cc *jetstream.ConsumerConfig) (p Problem, ok bool) {
	if cc.ReplayPolicy != jetstream.ReplayOriginalPolicy {
		return Problem{}, false
	}
	return Problem{Warning: true, Message: fmt.Sprintf("consumer %s has replay policy original: the server delivers its "+
		"events at the pace they were published, so a backlog drains no faster than it came in (the server does not let an update change it)", name),
		Fix: "to drain at full speed, delete it (nats consumer rm) and let jetsink create it, or choose another nats.consumer; a new durable " +
			"starts at the stream's first event unless made otherwise"}, true
}

// describeMaxDeliver says which MaxDeliver the durable consumer gets for
// nats.max_deliver n, and why it is not n itself.
func describeMaxDeliver(n int) string {
	if n < 0 {
		return "max_deliver -1 (unlimited)"
	}
	return fmt.Sprintf("max_deliver -1 (unlimited: jetsink dead-letters an event delivered more than nats.max_deliver %d times "+
		"itself, and keeps it until that dead letter is stored; a server-side limit could drop it unseen)", n)
}

// apiSubjects names the JetStream API subject rest under cfg's domain for a
// permission: with nats.domain, the servers of that domain check the
// $JS.API subject they map it to.
func apiSubjects(cfg Config, rest string) string {
	if cfg.Domain == "" {
		return "$JS.API." + rest
	}
	return cfg.APIPrefix() + "." + rest + " (on the servers of domain " + cfg.Domain + " themselves: $JS.API." + rest + ")"
}

// noJetStreamHint says what to look at when no JetStream answers on the
// server (nats.go's no responders, or JetStream not enabled): the server's
// -js, or nats.domain. New and check say the same.
func noJetStreamHint(domain string) string {
	if domain != "" {
		return fmt.Sprintf("no JetStream answers in domain %q from this server: check nats.domain, "+
			"and, through a leaf node, that its link to the servers of that domain is up (just after it comes up, their JetStream answers a moment later)", domain)
	}
	return "no JetStream answers on this server: is it run with -js? If the stream is in another JetStream domain, such as a leaf node's hub, set nats.domain"
}
