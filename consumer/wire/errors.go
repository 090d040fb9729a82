package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Sentinels. Classify with errors.Is; the messages are for humans.
var (
	// ErrInvalidOptions wraps every rejection of Options or PullOptions.
	ErrInvalidOptions = errors.New("wire: invalid options")
	// ErrConnectionClosed: the connection is closed, by Close or because
	// it failed (Conn.Err says why). Settling a message after that
	// returns an error wrapping it.
	ErrConnectionClosed = errors.New("wire: connection closed")
	// ErrStaleConnection: more than Options.MaxPingsOut pings went
	// unanswered.
	ErrStaleConnection = errors.New("wire: stale connection: pings unanswered")
	// ErrProtocol: the server sent something this client cannot parse, or
	// a frame larger than its max_payload allows.
	ErrProtocol = errors.New("wire: protocol error")
	// ErrAuthorization: the server refused the credentials.
	ErrAuthorization = errors.New("wire: authorization refused")
	// ErrNoHeartbeat: a pull subscription saw neither a message nor an
	// idle heartbeat for two to three heartbeat intervals (it looks once
	// an interval, and reports the second quiet look; a look that finds
	// the reader part-way through a frame whose bytes still arrive, a
	// large message over a slow link, is not quiet). The Sub pulls again
	// by itself; the caller decides whether the consumer is still there.
	ErrNoHeartbeat = errors.New("wire: no heartbeat received")
	// ErrNoResponders: a pull found nothing to answer it (status 503): no
	// server holds the consumer now (a leader election, or the consumer is
	// gone). The Sub pulls again at its next heartbeat tick; the caller
	// decides whether the consumer is still there.
	ErrNoResponders = errors.New("wire: no responders for the pull")
	// ErrConsumerDeleted: the server says the consumer was deleted. It ends
	// the Sub.
	ErrConsumerDeleted = errors.New("wire: consumer deleted")
	// ErrConsumerPushBased: the consumer is a push consumer; pulling from
	// it cannot work. It ends the Sub.
	ErrConsumerPushBased = errors.New("wire: consumer is push based")
	// ErrBadRequest: the server refused the pull request (status 400, or
	// 409 for a pull past the consumer's max_request_* limits). It ends
	// the Sub.
	ErrBadRequest = errors.New("wire: pull request refused")
	// ErrMsgAlreadyAcked: the message was already settled for good (Ack,
	// Nak, Term); it cannot be settled again or marked in progress.
	ErrMsgAlreadyAcked = errors.New("wire: message already settled")
	// ErrMsgNoReply: the message has no reply subject, so it is not a
	// JetStream message and cannot be settled.
	ErrMsgNoReply = errors.New("wire: message has no reply subject")
)

// StallError: a Sub has opened no pull for Waited because its Budget had
// no room, while the Budget's held bytes did not change: nothing was
// released. The handler's side is stuck (what it holds waits on
// something), or a message is held that will never be released. Reported
// through the Sub's onErr after PullOptions.StallAfter, and again each
// time the wait has doubled; the Sub goes on waiting.
type StallError struct {
	Waited      time.Duration
	Held, Limit int64 // the Budget's, in bytes
}

func (e *StallError) Error() string {
	return fmt.Sprintf("wire: no pull for %v: the messages handed on hold %d bytes of the in-flight budget's %d, and none was released meanwhile",
		e.Waited.Round(time.Second), e.Held, e.Limit)
}

// ServerError is an -ERR the server sent. The text is the server's own and
// never holds a credential.
type ServerError struct {
	Text string
}

func (e *ServerError) Error() string { return "wire: server error: " + e.Text }

// Is makes an authorization or authentication -ERR match ErrAuthorization,
// so that callers need not look at the text.
func (e *ServerError) Is(target error) bool {
	if target != ErrAuthorization {
		return false
	}
	t := strings.ToLower(e.Text)
	return strings.Contains(t, "authorization") || strings.Contains(t, "authentication")
}

// fatal says whether the server closes the connection after this -ERR;
// only permission violations leave it open.
func (e *ServerError) fatal() bool {
	return !strings.HasPrefix(strings.ToLower(e.Text), "permissions violation")
}

// StatusError is a JetStream status the server answered a pull with, other
// than the idle heartbeat and the expiry of a request. Terminal ones
// (ErrConsumerDeleted, ErrConsumerPushBased, ErrBadRequest) wrap it.
type StatusError struct {
	Code        int
	Description string
}

func (e *StatusError) Error() string {
	s := "wire: jetstream status " + strconv.Itoa(e.Code)
	if e.Description != "" {
		s += " " + e.Description
	}
	return s
}
