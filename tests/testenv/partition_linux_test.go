package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recordTB records Skip and Fatal, which end the goroutine as testing's
// do, instead of ending the test.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper()           {}
func (r *recordTB) Skip(args ...any)  { r.skipped = fmt.Sprint(args...); runtime.Goexit() }
func (r *recordTB) Fatal(args ...any) { r.failed = fmt.Sprint(args...); runtime.Goexit() }

// run calls f with r on a goroutine of its own, which Skip and Fatal end.
func (r *recordTB) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

// Without root or ip, a partition test skips for a developer (make test as
// a normal user), saying what it needs and how to run it, and fails in CI,
// which must run every test.
func TestPartitionNeedsRootAndIP(t *testing.T) {
	for _, tc := range []struct {
		name string
		euid int
		ip   string
		want []string // in the message; none: nothing missing
	}{
		{"root with ip", 0, "/usr/sbin/ip", nil},
		{"not root", 1000, "/usr/sbin/ip", []string{"needs root", "sudo", "go test -run"}},
		{"no ip", 0, "", []string{"iproute2", "sudo", "go test -run"}},
		{"neither", 1000, "", []string{"root", "iproute2"}},
	} {
		for _, ci := range []string{"", "true"} {
			t.Run(fmt.Sprintf("%s/CI=%q", tc.name, ci), func(t *testing.T) {
				t.Setenv("CI", ci)
				r := &recordTB{TB: t}
				r.run(func(tb testing.TB) { SkipOrFail(tb, partitionMissing(tc.euid, tc.ip)) })
				switch {
				case tc.want == nil:
					if r.skipped != "" || r.failed != "" {
						t.Fatalf("skipped %q, failed %q; want neither", r.skipped, r.failed)
					}
					return
				case ci == "" && (r.skipped == "" || r.failed != ""):
					t.Fatalf("skipped %q, failed %q; want a skip without CI", r.skipped, r.failed)
				case ci != "" && (r.failed == "" || r.skipped != ""):
					t.Fatalf("skipped %q, failed %q; want a failure in CI", r.skipped, r.failed)
				}
				for _, w := range tc.want {
					if msg := r.skipped + r.failed; !strings.Contains(msg, w) {
						t.Errorf("message %q does not say %q", msg, w)
					}
				}
			})
		}
	}
}
