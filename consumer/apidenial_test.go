package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A NATS user the server refuses a JetStream API request New (or check)
// needs is a bad configuration naming the subject to allow: the server
// refuses on the connection, not to the request, which waited out its
// timeout. As measured before: "create or update consumer ...: context
// deadline exceeded" after 5 s for a user who may not create consumers,
// and "look up stream ...: context deadline exceeded", of New and check,
// for one who may only pull and ack.
func TestNewNamesTheRefusedAPISubject(t *testing.T) {
	for _, tc := range []struct {
		name string
		deny []string
		want string // the subject named, after $JS.API.
		// checkToo: Check fails at it too (check does not make the
		// durable, and passes the first).
		checkToo bool
	}{
		{"no consumer create", []string{"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"}, "CONSUMER.CREATE.", false},
		{"pulls and acks only", []string{"$JS.API.STREAM.>", "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.>",
			"$JS.API.CONSUMER.INFO.>", "$JS.API.CONSUMER.LIST.>"}, "STREAM.INFO.", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			js, cfg, _ := permissionsServer(t, ctx, tc.deny...)
			cfg.CreateStream = false
			makeStream(t, ctx, js, cfg)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream + "_DLQ", Subjects: []string{cfg.DeadLetterSubject}}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
				AckWait: cfg.AckWait, MaxDeliver: durableMaxDeliver}); err != nil {
				t.Fatal(err)
			}
			// Without a deadline, as run's: nats.go's request timeout
			// bounds each request.
			c, err := New(noDeadline{ctx}, cfg, testLogger(t, nil))
			if c != nil {
				_ = c.Close(ctx)
			}
			want := "the NATS user may not publish to $JS.API." + tc.want + cfg.Stream
			if !errors.Is(err, ErrInvalidConfig) || err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("New = %v; want a bad configuration saying %q", err, want)
			}
			if tc.checkToo {
				ps, err := Check(noDeadline{ctx}, cfg, testLogger(t, nil))
				if !errors.Is(err, ErrInvalidConfig) || err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Check = %v (problems:\n%s); want a bad configuration saying %q", err, problemsText(ps), want)
				}
			}
		})
	}
}
