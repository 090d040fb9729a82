package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jetsink/jetsink/embedded"
)

var jetsinkBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Jetsink builds the jetsink command once per test binary, without -race so
// that a subprocess runs at its real speed, and returns its path. Main
// removes it when the tests end. Start it with DieWithTest.
func Jetsink(t testing.TB) string {
	t.Helper()
	jetsinkBin.once.Do(func() {
		// Owned: if this test binary dies before Main removes it, the
		// next one's Jetsink does.
		dir, err := embedded.TempDir("jetsink-bin-")
		if err != nil {
			jetsinkBin.err = err
			return
		}
		jetsinkBin.dir = dir
		jetsinkBin.path = filepath.Join(dir, "jetsink")
		out, err := exec.Command("go", "build", "-o", jetsinkBin.path, "github.com/jetsink/jetsink/cmd/jetsink").CombinedOutput()
		if err != nil {
			jetsinkBin.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if jetsinkBin.err != nil {
		t.Fatalf("build jetsink: %v", jetsinkBin.err)
	}
	return jetsinkBin.path
}

func removeJetsink() {
	if jetsinkBin.dir != "" {
		_ = embedded.RemoveTempDir(jetsinkBin.dir)
	}
}
