package embedded

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ownerFile holds the pid of the process that made a temporary directory
// and, on a second line, when that process started (procStart): a pid
// alone may since name another process (pids are reused, soon in a
// container), which would keep an orphan from ever being swept.
const ownerFile = "owner.pid"

// Prefixes of the temporary directories this package makes and sweeps.
const (
	natsDirPrefix = "jetsink-nats-"
	pgDirPrefix   = "jetsink-pg-"
	DemoDirPrefix = "jetsink-demo-" // jetsink demo --keep's (TempDir), swept by StartPostgres
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
	owner := strconv.Itoa(os.Getpid())
	if start, ok := procStart(os.Getpid()); ok {
		owner += "\n" + start
	}
	if err := writeOwnerFile(dir, owner+"\n"); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// writeOwnerFile writes dir's owner file, share-locked (flock) from before
// a sweep can see it: made under another name, locked, then renamed, so
// that no sweep finds it unlocked while its owner runs. The lock is held
// until removeOwned(dir), or until this process ends.
func writeOwnerFile(dir, owner string) error {
	tmp := filepath.Join(dir, ownerFile+".new")
	// Read and write: on NFS, where flock is a byte-range lock, a shared
	// lock needs the file open for reading. Not waiting: no sweep sees
	// the file under this name.
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return fmt.Errorf("lock %s: %w", tmp, err)
	}
	if _, err := f.WriteString(owner); err != nil {
		_ = f.Close()
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ownerFile)); err != nil {
		_ = f.Close()
		return err
	}
	ownerLocks.mu.Lock()
	defer ownerLocks.mu.Unlock()
	if ownerLocks.files == nil {
		ownerLocks.files = make(map[string]*os.File)
	}
	ownerLocks.files[dir] = f
	return nil
}

// ownerLocks are the owner files of this process's directories, each open
// and share-locked (flock) while the directory is in use: a sweep leaves a
// directory whose owner file it cannot lock alone, whatever the pid says.
// A pid does not tell from another PID namespace (two containers sharing
// /tmp): there it may be dead, or another process's, while the owner runs.
var ownerLocks struct {
	mu    sync.Mutex
	files map[string]*os.File
}

// RemoveTempDir removes a directory TempDir made, and lets go of its
// owner file.
func RemoveTempDir(dir string) error { return removeOwned(dir) }

// removeOwned removes a directory ownedTempDir made and lets its owner
// file's lock go.
func removeOwned(dir string) error {
	err := os.RemoveAll(dir)
	ownerLocks.mu.Lock()
	defer ownerLocks.mu.Unlock()
	if f := ownerLocks.files[dir]; f != nil {
		_ = f.Close()
		delete(ownerLocks.files, dir)
	}
	return err
}

// lockOwnerFile takes the exclusive lock of the owner file at path, for a
// sweep to hold while it removes the directory; nil, and locked true, when
// a process holds the file's lock (writeOwnerFile): this one too, for its
// own directories; or when the lock cannot be asked for (a file system
// without flock): nothing is removed that may be in use. An owner file
// that cannot be opened gives nil, false.
func lockOwnerFile(path string) (f *os.File, locked bool) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, true
	}
	return f, false
}

// TempDir makes a new directory prefix+"*" in os.TempDir() that only this
// user may enter, marked as this process's, after removing those of the
// same prefix whose process died without doing so (see the package doc).
// The caller removes it with RemoveTempDir.
func TempDir(prefix string) (string, error) {
	sweepOrphansOnce(prefix, nil)
	return ownedTempDir(prefix, 0o700)
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
// still run, is left alone; so is one that this user did not make (see
// madeByUs): the temporary directory is everyone's.
func sweepOrphans(prefix string, stop func(dir string) bool) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		if !madeByUs(dir) {
			continue
		}
		// Held until the directory is gone: an owner cannot lock a file a
		// sweep has locked, but the sweep's look and removal are one.
		path := filepath.Join(dir, ownerFile)
		lock, locked := lockOwnerFile(path)
		if !locked && !ownerAlive(path) && (stop == nil || stop(dir)) {
			_ = os.RemoveAll(dir)
		}
		if lock != nil {
			_ = lock.Close()
		}
	}
}

// madeByUs reports whether dir is a directory (not a link to one) whose
// owner file is a regular file of this user's: what ownedTempDir makes
// (the directory itself may have been given to another user, as a
// cluster's is to postgres). Any local user can make a directory with
// this package's prefix in the temporary directory, and an owner file
// naming a dead process; acting on theirs would stop, as this user, a
// server whose pid they chose, and remove what they link to.
func madeByUs(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	fi, err = os.Lstat(filepath.Join(dir, ownerFile))
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

// readRegular reads at most limit bytes of the regular file at path, its
// start or (tail) its end, without following a symbolic link as the last
// part of path: the files read in a cluster's directory, which the
// server's user owns, could be made links to any file root may read, or
// FIFOs that never end. (A link as the data directory is not refused:
// only a file named postmaster.pid could be read through it, and runsIn
// guards what is done with its pid.)
func readRegular(path string, limit int64, tail bool) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if tail && fi.Size() > limit {
		if _, err := f.Seek(fi.Size()-limit, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// readPID reads a positive process ID from the first line of a file.
func readPID(path string) (int, error) {
	b, err := readRegular(path, 4<<10, false)
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

// ownerAlive reports whether the process an owner file names may still
// run: true when the file cannot be read, or the process lives and started
// when the file says (a file without a start time is trusted on the pid).
// For an owner file no process holds the lock of (lockOwnerFile): its
// owner died, or is an older jetsink, which took no lock.
func ownerAlive(path string) bool {
	pid, err := readPID(path)
	if err != nil {
		return true
	}
	if !processAlive(pid) {
		return false
	}
	b, _ := readRegular(path, 4<<10, false)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		return true
	}
	start, ok := procStart(pid)
	return !ok || start == strings.TrimSpace(lines[1])
}

// procStart is when process pid started, in clock ticks after boot (field
// 22 of /proc/<pid>/stat); false where there is no /proc.
func procStart(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count from after its closing one (field 3 on).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", false
	}
	return f[19], true
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
