package processor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// One stage failing ends hard and intake for the others, and only its own
// error is reported: theirs, caused by hard's end, are not failures.
// A stage's own context.Canceled is a failure while hard lives.
func TestStagesStopTogether(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
	}{
		{"an error", errors.New("pin: no such CPU")},
		{"a context.Canceled of the stage's own", fmt.Errorf("lookup: %w", context.Canceled)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hard, cancelHard := context.WithCancelCause(context.Background())
			defer cancelHard(nil)
			intake, cancelIntake := context.WithCancel(context.Background())
			defer cancelIntake()
			st := &stages{hard: hard, cancelHard: cancelHard, cancelIntake: cancelIntake}

			fail := make(chan struct{})
			st.start("waits on intake", func() error {
				<-intake.Done() // like the consumer's start-up checks
				return fmt.Errorf("stored seq: %w", intake.Err())
			})
			st.start("waits on hard", func() error {
				<-hard.Done()
				return fmt.Errorf("push: %w", hard.Err())
			})
			st.start("fails", func() error {
				<-fail
				return tc.fail
			})
			close(fail)
			errs := waitStages(t, st)
			if len(errs) != 1 || !errors.Is(errs[0], tc.fail) || errs[0].Error() != "fails: "+tc.fail.Error() {
				t.Fatalf("errors %q, want only the failing stage's %q", errs, tc.fail)
			}
			if !errors.Is(context.Cause(hard), tc.fail) {
				t.Errorf("hard's cause %v, want the stage's error", context.Cause(hard))
			}
		})
	}
}

// A stage that ends without error, or because the caller ended hard,
// stops nothing and reports nothing: a hard cancelled, or one that reached
// its deadline (context.WithTimeout). Before, the latter's
// DeadlineExceeded counted as a failure: the first ended hard with itself
// as the cause, and Run returned "consumer: ... context deadline exceeded"
// rather than hard's error.
func TestStagesQuietEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hard is the caller's hard context and the function that
		// returns once it has ended.
		hard func() (ctx context.Context, end, release func())
	}{
		{"cancelled", func() (context.Context, func(), func()) {
			ctx, cancel := context.WithCancel(context.Background())
			return ctx, cancel, cancel
		}},
		{"at its deadline", func() (context.Context, func(), func()) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			return ctx, func() { <-ctx.Done() }, cancel
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			callerHard, callerEnd, release := tc.hard()
			defer release()
			hard, cancelHard := context.WithCancelCause(callerHard)
			defer cancelHard(nil)
			intake, cancelIntake := context.WithCancel(context.Background())
			defer cancelIntake()
			st := &stages{hard: hard, cancelHard: cancelHard, cancelIntake: cancelIntake}
			st.start("done", func() error { return nil })
			waitStages(t, st)
			if hard.Err() != nil || intake.Err() != nil {
				t.Fatalf("a stage ending cleanly ended hard (%v) or intake (%v)", hard.Err(), intake.Err())
			}
			callerEnd()
			// A context closes its Done before it cancels its children:
			// the stage sees hard ended, as a real one does, only after.
			<-hard.Done()
			st.start("cut short", func() error { return fmt.Errorf("drain cut short: %w", hard.Err()) })
			if errs := waitStages(t, st); len(errs) != 0 {
				t.Fatalf("errors %q after the caller ended hard, want none", errs)
			}
			if cause, want := context.Cause(hard), context.Cause(callerHard); cause != want {
				t.Errorf("hard's cause %v, want the caller's, %v", cause, want)
			}
			if intake.Err() != nil {
				t.Error("the caller ending hard ended intake through the stages")
			}
		})
	}
}

// Once the caller's hard has ended, wait gives the stages abortedBudget
// and returns, naming those still running: a write to a NATS server that
// reads nothing holds a stage (its ack, under the connection's lock) until
// the write's timeout, 10 s or more, past the ~2.5 s a cut-short stop
// promises. Before, Run waited for it.
func TestStagesWaitBoundedOnceHardEnds(t *testing.T) {
	callerHard, callerCancel := context.WithCancel(context.Background())
	hard, cancelHard := context.WithCancelCause(callerHard)
	defer cancelHard(nil)
	_, cancelIntake := context.WithCancel(context.Background())
	defer cancelIntake()
	st := &stages{hard: hard, cancelHard: cancelHard, cancelIntake: cancelIntake}

	held := make(chan struct{}) // the write's timeout
	defer close(held)
	st.start("consumer", func() error {
		<-hard.Done()
		return fmt.Errorf("push: %w", hard.Err())
	})
	st.start("sink", func() error {
		<-held // deaf to hard, as a write under a connection's lock is
		return fmt.Errorf("ack: %w", context.Canceled)
	})

	// While the caller's hard lives, wait waits (a drain takes its time).
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		st.wait(callerHard.Done(), abortedBudget)
	}()
	select {
	case <-waited:
		t.Fatal("wait returned with a stage running and the caller's hard alive")
	case <-time.After(2 * abortedBudget):
	}

	callerCancel() // a second signal, or drain_timeout
	start := time.Now()
	select {
	case <-waited:
	case <-time.After(6 * time.Second):
		t.Fatal("wait still waits for a stage 6 s after the caller's hard ended")
	}
	if d := time.Since(start); d < abortedBudget {
		t.Errorf("wait returned %v after hard's end, before the stages' %v", d, abortedBudget)
	}
	errs, stuck := st.wait(callerHard.Done(), abortedBudget)
	if len(errs) != 0 {
		t.Errorf("errors %q, want none: hard's end stopped the consumer, and the sink has not returned", errs)
	}
	if len(stuck) != 1 || stuck[0] != "sink" {
		t.Errorf("stages still running %q, want [sink]", stuck)
	}
}

// waitStages is st.wait, failing the test if a stage has not stopped
// within 10 s (it never will: nothing ended what it waits on).
func waitStages(t *testing.T, st *stages) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() {
		errs, _ := st.wait(nil, 0)
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-time.After(10 * time.Second):
		t.Fatal("a stage still runs 10 s after another failed: what it waits on was not ended")
		return nil
	}
}

// The hard stop's Warn says what is known to hold each stage left
// running. The sink held while a commit attempt runs is waiting on
// PostgreSQL (a COPY given up on waits up to 5 s for the answer to its
// cancel: the lifecycle review saw stages=sink with PostgreSQL blackholed
// and NATS healthy), which the line named only as a write to NATS before.
func TestHardStopSaysWhatHoldsTheStages(t *testing.T) {
	held := heldBy([]string{"consumer", "pipeline", "sink"}, 6200*time.Millisecond)
	if len(held) != 3 {
		t.Fatalf("heldBy = %q, want one cause for each of 3 stages", held)
	}
	if s := held[2]; !strings.HasPrefix(s, "sink: a commit attempt on PostgreSQL under way for 6.2s") || !strings.Contains(s, "cancel") {
		t.Errorf("the sink in a commit attempt: %q, want the attempt on PostgreSQL and its cancel named", s)
	}
	if s := held[1]; !strings.HasPrefix(s, "pipeline: ") || !strings.Contains(s, "dead letter") {
		t.Errorf("the pipeline: %q, want its dead letter's publish named", s)
	}
	if s := held[0]; !strings.HasPrefix(s, "consumer: ") || !strings.Contains(s, "NATS") {
		t.Errorf("the consumer: %q, want a write to NATS named", s)
	}
	if s := heldBy([]string{"sink"}, 0)[0]; strings.Contains(s, "PostgreSQL") || !strings.Contains(s, "NATS") {
		t.Errorf("the sink with no commit attempt under way: %q, want a write to NATS named, not PostgreSQL", s)
	}
}
