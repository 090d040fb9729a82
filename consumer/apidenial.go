package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// apiDenial is the JetStream API subject the server last refused the NATS
// user a publish to on nc, when that refusal is nc's last error and not
// before (the last error when the requests began); "" for none. The
// server refuses on the connection (an async -ERR), not to the request,
// which waits out its timeout and fails with "context deadline exceeded"
// or "JetStream does not answer", naming no permission. On the servers
// of nats.domain themselves, the server names the $JS.API subject it
// mapped the domain's to.
func apiDenial(nc *nats.Conn, cfg *Config, before error) string {
	last := nc.LastError()
	if last == nil || last == before || !errors.Is(last, nats.ErrPermissionViolation) {
		return ""
	}
	_, subject, ok := strings.Cut(last.Error(), `Publish to "`)
	if !ok {
		return ""
	}
	subject, _, _ = strings.Cut(subject, `"`)
	if !strings.HasPrefix(subject, cfg.APIPrefix()+".") && !strings.HasPrefix(subject, "$JS.API.") {
		return ""
	}
	return subject
}

// inboxDenial is the reply subject the server last refused the NATS user
// a subscription to on nc (under its inbox prefix, _INBOX by default),
// when that refusal is nc's last error and not before; "" for none.
// Without it no request is answered: each waits out its timeout.
func inboxDenial(nc *nats.Conn, before error) string {
	last := nc.LastError()
	if last == nil || last == before || !errors.Is(last, nats.ErrPermissionViolation) {
		return ""
	}
	_, subject, ok := strings.Cut(last.Error(), `Subscription to "`)
	if !ok {
		return ""
	}
	subject, _, _ = strings.Cut(subject, `"`)
	if !strings.HasPrefix(subject, inboxPrefix(nc)+".") {
		return ""
	}
	return subject
}

// inboxPrefix is the prefix of nc's reply subjects.
func inboxPrefix(nc *nats.Conn) string {
	if p := nc.Opts.InboxPrefix; p != "" {
		return p
	}
	return "_INBOX"
}

// apiDenialError is err, the failure of New's (or check's) JetStream API
// requests made on nc since before, as a bad configuration
// (ErrInvalidConfig) naming the subject to allow when the server refused
// the user one of them (apiDenial) and err is what such a refusal gives:
// no answer, or the watch's cancel (watchAPIDenial); else err.
func apiDenialError(nc *nats.Conn, cfg *Config, before, err error) error {
	if !jetStreamSilent(err) && !errors.Is(err, context.Canceled) {
		return err
	}
	if inbox := inboxDenial(nc, before); inbox != "" {
		return fmt.Errorf("%w: the NATS user may not subscribe to %s, where the replies to jetsink's requests come (%w); "+
			"fix: give the user permission to subscribe to %s.>", ErrInvalidConfig, inbox, err, inboxPrefix(nc))
	}
	subject := apiDenial(nc, cfg, before)
	if subject == "" {
		return err
	}
	return fmt.Errorf("%w: the NATS user may not publish to %s, a JetStream API request jetsink makes (%w); "+
		"fix: give the user permission to publish to it (or to %s.>)", ErrInvalidConfig, subject, err, cfg.APIPrefix())
}

// watchAPIDenial returns ctx, cancelled as soon as the server refuses the
// user a publish to a JetStream API subject on nc (apiDenial; the last
// error other than before) that New cannot do without (fatalSubject), so
// that its request fails at once rather than at its timeout; and a
// function that stops the watch and waits for it to end. Not the others,
// whose refusal New takes with a warning (the look at the stream's
// consumers, the dead-letter stream's without create_stream).
func watchAPIDenial(ctx context.Context, nc *nats.Conn, cfg *Config, before error) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := pollDenial(ctx, cancel, func() bool {
		s := apiDenial(nc, cfg, before)
		return s != "" && fatalSubject(cfg, s) || inboxDenial(nc, before) != ""
	})
	return ctx, func() {
		stop()
		cancel()
	}
}

// fatalSubject reports whether New fails without the JetStream API
// subject s: the account's info, the event stream's create or update, the
// durable's info, create or update. (Not the stream's info, which the
// look at the stream's consumers asks for too, and goes on without:
// refused to ensureStream, it is named once its request times out.)
func fatalSubject(cfg *Config, s string) bool {
	for _, prefix := range []string{cfg.APIPrefix() + ".", "$JS.API."} {
		rest, ok := strings.CutPrefix(s, prefix)
		if !ok {
			continue
		}
		if rest == "INFO" || rest == "STREAM.CREATE."+cfg.Stream || rest == "STREAM.UPDATE."+cfg.Stream ||
			rest == "CONSUMER.INFO."+cfg.Stream+"."+cfg.Consumer || strings.HasPrefix(rest, "CONSUMER.CREATE."+cfg.Stream+".") ||
			rest == "CONSUMER.DURABLE.CREATE."+cfg.Stream+"."+cfg.Consumer {
			return true
		}
	}
	return false
}

// withDenial is args, and, when the connection's last error is the server
// refusing the user a publish to the JetStream API subject rest (its
// subject after the API prefix: lookDenial), the fix naming it: a look the
// server refuses waits out its timeout and says only that.
func withDenial(nc *nats.Conn, cfg *Config, rest string, args ...any) []any {
	if nc != nil && lookDenial(nc, cfg, nil, rest) != nil {
		args = append(args, "fix", "give the NATS user permission to publish to "+cfg.APIPrefix()+"."+rest)
	}
	return args
}
