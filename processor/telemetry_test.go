package processor

import (
	"testing"

	"github.com/jetsink/jetsink/consumer"
	"github.com/jetsink/jetsink/sink"
)

// jetsink_ack_failures_total counts every settlement that failed or may
// have: a dead letter's term that failed in the client too (its event
// comes back after ack_wait, as an ack's does), which it left out before;
// a nak that gave an event back (Released) and failed in the client.
func TestAckFailuresCountsEveryKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   consumer.Stats
		ss   sink.Stats
		want uint64
	}{
		{"none", consumer.Stats{DeadLettered: 5, StaleTerms: 1}, sink.Stats{Rows: 9, StaleAcks: 2}, 0},
		// Not failures: their own counters, jetsink.ack.resent and
		// jetsink.ack.leader_change_lost (JetsinkAcksFailing must not fire
		// at each rolling restart of a cluster).
		{"a consumer leader change", consumer.Stats{AcksResent: 9, AcksMaybeLostAtLeaderChange: 4096}, sink.Stats{}, 0},
		{"ack failed in the client", consumer.Stats{}, sink.Stats{AckErrors: 1}, 1},
		{"term failed in the client", consumer.Stats{TermErrors: 1}, sink.Stats{}, 1},
		{"unconfirmed", consumer.Stats{AcksUnconfirmed: 1}, sink.Stats{}, 1},
		{"refused", consumer.Stats{AcksRefused: 1}, sink.Stats{}, 1},
		{"nak giving an event back failed in the client", consumer.Stats{}, sink.Stats{Released: 7, ReleaseErrors: 1}, 1},
		{"all", consumer.Stats{TermErrors: 2, AcksUnconfirmed: 3, AcksRefused: 4}, sink.Stats{AckErrors: 1, Released: 9, ReleaseErrors: 5}, 15},
	} {
		if got := ackFailures(tc.cs, tc.ss); got != tc.want {
			t.Errorf("%s: ackFailures = %d, want %d", tc.name, got, tc.want)
		}
	}
}
