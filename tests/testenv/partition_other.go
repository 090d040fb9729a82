//go:build !linux

package testenv

import (
	"errors"
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

// errOffLinux is what Do returns off Linux.
var errOffLinux = errors.New("testenv: Partition off Linux")

// Cut, Heal and Do are not reached off Linux (NewPartition skips). They
// fail rather than panic, so that staticcheck's macOS pass does not take
// the code after them for unreachable.
func (p *Partition) Cut(t testing.TB)      { t.Helper(); t.Error(errOffLinux) }
func (p *Partition) Heal(t testing.TB)     { t.Helper(); t.Error(errOffLinux) }
func (p *Partition) Do(func() error) error { return errOffLinux }
