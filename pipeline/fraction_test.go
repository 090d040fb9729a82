package pipeline

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// pgFractionMicros's decimal shortcut agrees with PostgreSQL's floating
// point rounding (pgFractionMicrosFloat; the round-trip test checks that
// against a real server) on exact ties, near ties, carries and random
// fractions of every length.
func TestFractionMicrosShortcut(t *testing.T) {
	cases := []string{".0000005", ".0000015", ".0000025", ".1234565", ".12345650", ".123456500000001",
		".123456499999999", ".9999995", ".9999994", ".99999949999", ".999999999999999", ".0000000",
		".000000500000000", ".000000499999999", ".1234567890", ".000000000000001"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		k := 7 + r.IntN(12) // 7..18 digits
		var b strings.Builder
		b.WriteByte('.')
		for range k {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		cases = append(cases, b.String())
		// The same digits turned into a tie, and next to one.
		tie := []byte(b.String())
		if k > 7 {
			tie[7] = '5'
			for i := 8; i < len(tie); i++ {
				tie[i] = '0'
			}
			cases = append(cases, string(tie))
			tie[len(tie)-1] = '1'
			cases = append(cases, string(tie))
		}
	}
	for _, c := range cases {
		if got, want := pgFractionMicros(c), pgFractionMicrosFloat(c); got != want {
			t.Errorf("pgFractionMicros(%q) = %d, PostgreSQL's rounding %d", c, got, want)
		}
	}
}
