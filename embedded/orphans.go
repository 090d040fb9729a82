package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ownerFile holds the pid of the process that made a temporary directory.
const ownerFile = "owner.pid"

// Prefixes of the temporary directories this package makes and sweeps.
const (
	natsDirPrefix = "jetsink-nats-"
	pgDirPrefix   = "jetsink-pg-"
)

// ownedTempDir makes a new directory prefix+"*" in os.TempDir() with
// permissions perm and an owner file naming this process, so that a later
// sweepOrphans removes it if this process dies without doing so (a panic,
// SIGKILL, a test binary killed by -timeout).
func ownedTempDir(prefix string, perm os.FileMode) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, perm); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// sweeps runs each kind's sweep once per process.
var sweeps struct {
	mu   sync.Mutex
	done map[string]bool
}

// sweepOrphansOnce is sweepOrphans, once per prefix and process.
func sweepOrphansOnce(prefix string, stop func(dir string) bool) {
	sweeps.mu.Lock()
	defer sweeps.mu.Unlock()
	if sweeps.done[prefix] {
		return
	}
	if sweeps.done == nil {
		sweeps.done = make(map[string]bool)
	}
	sweeps.done[prefix] = true
	sweepOrphans(prefix, stop)
}

// sweepOrphans removes the directories prefix+"*" in os.TempDir() whose
// owning process (see ownedTempDir) is dead, calling stop, if not nil, on
// each first to stop what still runs there. A directory without an owner
// file, whose owner is alive, or where stop reports that something may
// still run, is left alone.
func sweepOrphans(prefix string, stop func(dir string) bool) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		pid, err := readPID(filepath.Join(dir, ownerFile))
		if err != nil || processAlive(pid) {
			continue
		}
		if stop != nil && !stop(dir) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// readPID reads a positive process ID from the first line of a file.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: no process ID", path)
	}
	return pid, nil
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
