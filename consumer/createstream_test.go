package consumer

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A stream deleted and made again at once, the account's only one, is
// made: nats-server may refuse the create while it removes the account's
// emptied folders (CreateStream). Without the tries again this failed in
// each of three runs under -race (and bench's probe of the same race in
// each of four, after 30 to 400 pairs).
func TestCreateStreamAfterDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js := jsFor(t, testenv.NATS(t)) // a server of its own: no other stream in the account
	sc := jetstream.StreamConfig{Name: "AGAIN", Subjects: []string{"again"}, Storage: jetstream.FileStorage}
	for i := range 1500 {
		if _, err := CreateStream(ctx, js, sc); err != nil {
			t.Fatalf("pair %d: %v", i, err)
		}
		if err := js.DeleteStream(ctx, sc.Name); err != nil {
			t.Fatalf("pair %d: delete: %v", i, err)
		}
	}
}

// storeRefusals is a JetStream whose first n stream creates are answered
// as nats-server answers a store it could not make, the rest passed on.
type storeRefusals struct {
	jetstream.JetStream
	n, calls int
	err      error
}

func (s *storeRefusals) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s.calls++
	if s.calls <= s.n {
		return nil, s.err
	}
	return s.JetStream.CreateStream(ctx, cfg)
}

// CreateStream tries a store refusal five times in all, returning the
// last; other errors, and a context ended, at once.
func TestCreateStreamTries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := jsFor(t, testenv.NATS(t))
	refusal := &jetstream.APIError{Code: 500, ErrorCode: 10049, Description: "error creating store for stream"}
	other := &jetstream.APIError{Code: 500, ErrorCode: 10049, Description: "subjects overlap with an existing stream"}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	for i, tc := range []struct {
		ctx       context.Context
		n         int
		err       error
		calls     int
		succeeded bool
	}{
		{ctx, 4, refusal, 5, true},
		{ctx, 5, refusal, 5, false},
		{ctx, 9, refusal, 5, false},
		{ctx, 1, other, 1, false},
		{cancelled, 1, refusal, 1, false},
	} {
		sj := &storeRefusals{JetStream: js, n: tc.n, err: tc.err}
		name := "TRIES" + strconv.Itoa(i)
		_, err := CreateStream(tc.ctx, sj, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage})
		if sj.calls != tc.calls || (err == nil) != tc.succeeded || (err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("%d refusals (%v): %d creates, err %v; want %d creates, succeeded %v", tc.n, tc.err, sj.calls, err, tc.calls, tc.succeeded)
		}
	}
}
