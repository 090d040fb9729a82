//go:build !linux

package testenv

import (
	"runtime"
	"testing"
)

// Partition is Linux's: a network namespace joined to the test's by a veth
// pair (partition_linux.go). Elsewhere NewPartition skips the test (fails
// it when CI is set), so its methods are never reached.
type Partition struct{ HostIP string }

// NewPartition skips t off Linux, saying why.
func NewPartition(t testing.TB) *Partition {
	t.Helper()
	SkipOrFail(t, "a network partition needs Linux's network namespaces, not "+runtime.GOOS)
	return nil
}

// Cut, Heal and Do are not reached off Linux (NewPartition skips).
func (p *Partition) Cut(testing.TB)        { panic("testenv: Partition off Linux") }
func (p *Partition) Heal(testing.TB)       { panic("testenv: Partition off Linux") }
func (p *Partition) Do(func() error) error { panic("testenv: Partition off Linux") }
