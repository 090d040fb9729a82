package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jetsink/jetsink/embedded"
)

// builtBin is one command built for the test binary.
type builtBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

var (
	jetsinkBin    builtBin
	natsServerBin builtBin
)

// build builds the main package pkg once per test binary as name, without
// -race so that a subprocess runs at its real speed, and returns its path.
// Main removes it when the tests end.
func (b *builtBin) build(t testing.TB, pkg, name string) string {
	t.Helper()
	b.once.Do(func() {
		// Owned: if this test binary dies before Main removes it, the
		// next one's build does.
		dir, err := embedded.TempDir("jetsink-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.dir = dir
		b.path = filepath.Join(dir, name)
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", pkg, b.err)
	}
	return b.path
}

// Jetsink builds the jetsink command once per test binary and returns its
// path. Start it with DieWithTest.
func Jetsink(t testing.TB) string {
	t.Helper()
	return jetsinkBin.build(t, "github.com/jetsink/jetsink/cmd/jetsink", "jetsink")
}

// NATSServerBinary builds nats-server, the version go.mod requires, once
// per test binary and returns its path: a server in a process of its own,
// which a test can kill as a crash would (NATSCluster).
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	return natsServerBin.build(t, "github.com/nats-io/nats-server/v2", "nats-server")
}

func removeBinaries() {
	for _, b := range []*builtBin{&jetsinkBin, &natsServerBin} {
		if b.dir != "" {
			_ = embedded.RemoveTempDir(b.dir)
		}
	}
}
