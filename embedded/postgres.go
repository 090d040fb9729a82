package embedded

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HowToProvidePostgres says how to get PostgreSQL when it is missing.
const HowToProvidePostgres = "install PostgreSQL 15 or newer so that initdb and pg_ctl are on PATH " +
	"(Debian, Ubuntu: apt-get install postgresql; binaries in /usr/lib/postgresql/<version>/bin), " +
	"or point jetsink at a server of your own"

// Cluster is a throwaway PostgreSQL cluster in a temporary directory.
type Cluster struct {
	mu      sync.Mutex
	dir     string // parent of data/ and the socket
	port    int
	bin     string // directory holding initdb, pg_ctl, postgres
	cred    *syscall.Credential
	opts    clusterOptions
	pass    string // the superuser's password, in URL
	running bool
	server  *postmaster // the server this process started, until reaped
}

// postmaster is a server process this one started, and reaps.
type postmaster struct {
	proc *os.Process
	done chan struct{} // closed once the process has ended and been reaped
	err  error         // Wait's, once done is closed
}

type clusterOptions struct {
	fsync bool
	bin   string        // directory holding initdb, pg_ctl, postgres; "" finds them (tests set it)
	ready time.Duration // how long the server may take to accept connections; 0 is readyTimeout
}

// readyTimeout is how long a server may take to accept connections, as
// pg_ctl start -t 60 gave it.
const readyTimeout = 60 * time.Second

// ClusterOption changes how NewCluster configures the server.
type ClusterOption func(*clusterOptions)

// WithFsync keeps fsync on, as in production; by default tests turn it off
// (commits still reach the OS before they return, so killing PostgreSQL
// loses nothing; only a machine crash could).
func WithFsync() ClusterOption { return func(o *clusterOptions) { o.fsync = true } }

// StartPostgres initdbs and starts a throwaway cluster in a new temporary
// directory on a free loopback port, as the "postgres" user when the process
// is root (PostgreSQL refuses root). The server is a child of this process,
// and shuts down when it ends (see the package doc). The caller must call
// Destroy. Errors say how to provide PostgreSQL when its binaries are
// missing.
func StartPostgres(opts ...ClusterOption) (*Cluster, error) {
	sweepOrphansOnce(pgDirPrefix, stopOrphan)
	sweepOrphansOnce(DemoDirPrefix, nil) // holds a URL with a dead cluster's password
	var o clusterOptions
	for _, opt := range opts {
		opt(&o)
	}
	return startCluster(o)
}

// URL connects to database db as the superuser "postgres", with the
// cluster's password: the server refuses connections without it, from
// other local users too. It is a secret (see the package doc).
func (c *Cluster) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.pass),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the TCP port the cluster listens on (127.0.0.1).
func (c *Cluster) Port() int { return c.port }

// PID is the postmaster's process ID, or 0 when the server is not running
// or its pid file cannot be read.
func (c *Cluster) PID() int {
	pid, _ := readPID(filepath.Join(c.dataDir(), "postmaster.pid"))
	return pid
}

// Stop stops the server with pg_ctl's mode: "smart", "fast" or "immediate"
// (immediate is a crash: no checkpoint, recovery on the next start).
func (c *Cluster) Stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stop(mode)
}

func (c *Cluster) stop(mode string) error {
	c.forgetDead()
	if !c.running {
		return nil
	}
	if err := c.run(30*time.Second, "pg_ctl", "-D", c.dataDir(), "-m", mode, "-w", "-t", "30", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w", mode, err)
	}
	c.running = false
	// pg_ctl saw postmaster.pid go, which the server removes as it exits.
	if !c.reap(10*time.Second) && !c.halt() {
		return errors.New(c.strayStays())
	}
	return nil
}

// Start starts a stopped server again on the same port and data directory.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start()
}

// Destroy stops the server and removes its directory. When pg_ctl fails
// to stop the server, or a failed Start left one running, Destroy kills it
// (and returns pg_ctl's error); if even that leaves it running, Destroy
// keeps the directory and returns an error saying so, so that the first
// StartPostgres after this process ends can find the server and stop it.
func (c *Cluster) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.stop("immediate")
	// Without its directory a server that survived would be found by no
	// sweep, and would keep its port and shared memory until reboot: one
	// that pg_ctl could not stop, or that a failed Start left running
	// (not c.running).
	if !c.stopStray() || !c.halt() {
		if err == nil {
			return errors.New(c.strayStays())
		}
		return fmt.Errorf("%w; %s", err, c.strayStays())
	}
	c.running = false
	if rmErr := removeOwned(c.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// StartStandby makes a streaming-replication standby of c, for tests of a
// failover: a base backup of the running server (pg_basebackup -R, which
// writes standby.signal and the connection to c, with c's password) in a
// new temporary directory, started on a free loopback port. It accepts
// read-only connections with c's password, and follows c until Promote.
// The caller must call Destroy.
func (c *Cluster) StartStandby() (*Cluster, error) {
	c.mu.Lock()
	primaryPort, running := c.port, c.running
	c.mu.Unlock()
	if !running {
		return nil, errors.New("standby: the primary is not running")
	}
	s := &Cluster{bin: c.bin, cred: c.cred, opts: c.opts, pass: c.pass}
	dir, err := ownedTempDir(pgDirPrefix, 0o700)
	if err != nil {
		return nil, fmt.Errorf("standby dir: %w", err)
	}
	s.dir = dir
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = removeOwned(dir)
			return nil, fmt.Errorf("give standby dir to postgres: %w", err)
		}
	}
	// The password goes in the environment of a process of the server's
	// own user (no other user may read it there), not in an argument.
	if err := s.runEnv(5*time.Minute, []string{"PGPASSWORD=" + c.pass}, "pg_basebackup",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primaryPort), "-U", "postgres",
		"-D", s.dataDir(), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"); err != nil {
		_ = removeOwned(dir)
		return nil, fmt.Errorf("standby: pg_basebackup: %w", err)
	}
	if err := s.startOnFreePort(); err != nil {
		return nil, fmt.Errorf("standby: %w", err)
	}
	return s, nil
}

// Promote makes a standby (StartStandby) a primary that accepts writes,
// and waits until it does.
func (c *Cluster) Promote() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.run(90*time.Second, "pg_ctl", "-D", c.dataDir(), "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w", err)
	}
	return nil
}

func startCluster(o clusterOptions) (*Cluster, error) {
	bin := o.bin
	var err error
	if bin == "" {
		if bin, err = findPostgresBin(); err != nil {
			return nil, err
		}
	}
	c := &Cluster{bin: bin, opts: o}
	if c.cred, err = postgresCredential(); err != nil {
		return nil, err
	}
	// The owner file lets a later StartPostgres stop and remove the cluster
	// if this process dies without doing so (a test binary killed by
	// -timeout). 0700: only the server's user (and root) may reach the
	// Unix socket and the files; clients connect over TCP, with the
	// password.
	dir, err := ownedTempDir(pgDirPrefix, 0o700)
	if err != nil {
		return nil, fmt.Errorf("cluster dir: %w", err)
	}
	c.dir = dir
	if sock := filepath.Join(dir, ".s.PGSQL.65535"); len(sock) > maxSocketPath {
		_ = removeOwned(dir)
		return nil, fmt.Errorf("the cluster's Unix socket %s would be longer than the %d bytes a socket path may have: set TMPDIR to a shorter directory, such as /tmp", sock, maxSocketPath)
	}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			_ = removeOwned(dir)
			return nil, fmt.Errorf("give cluster dir to postgres: %w", err)
		}
	}
	if err := c.initdb(); err != nil {
		_ = removeOwned(dir)
		if c.cred != nil {
			if p, ok := unreachable(dir, c.cred); ok {
				err = fmt.Errorf("%w\n(the user postgres, which the server runs as, may not enter %s: set TMPDIR to a directory it can reach, such as /tmp)", err, p)
			}
		}
		return nil, err
	}
	if err := c.startOnFreePort(); err != nil {
		return nil, err
	}
	return c, nil
}

// startOnFreePort starts the server of a new cluster on a free port, with
// three tries (another process may take a port between FreePort and the
// server's bind). When it fails, the cluster's directory is removed, unless
// a server may still run in it.
func (c *Cluster) startOnFreePort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		var err error
		if c.port, err = FreePort(); err != nil {
			_ = removeOwned(c.dir)
			return err
		}
		if err = c.start(); err == nil {
			return nil
		}
		if errors.Is(err, errStrayRuns) {
			// Without its directory, the server would be found by no
			// sweep; another attempt in it would fail the same way.
			return err
		}
		if attempt == 2 {
			_ = removeOwned(c.dir) // start stopped any server it left
			return err
		}
	}
}

// maxSocketPath is the longest path a Unix socket may have (sun_path's
// 108 bytes, less the terminating NUL).
const maxSocketPath = 107

// unreachable returns the first directory above dir (from the root down)
// that cred's user may not pass through by its owner, group or other
// search bit, and true; false when there is none it can tell (a
// supplementary group of the user's is not looked at).
func unreachable(dir string, cred *syscall.Credential) (string, bool) {
	var above []string
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		above = append(above, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(above) - 1; i >= 0; i-- {
		fi, err := os.Stat(above[i])
		if err != nil {
			return "", false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return "", false
		}
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			return above[i], true
		}
	}
	return "", false
}

// initdb makes the data directory with a random superuser password, which
// every connection must give, over TCP and the Unix socket alike: with
// trust, any local user could connect as the superuser and, with COPY ...
// TO PROGRAM, run commands as the server's OS user.
func (c *Cluster) initdb() error {
	c.pass = rand.Text()
	// A file, not an argument, which any local user could read in /proc;
	// it is removed once initdb has read it (the server keeps a SCRAM
	// verifier, not the password).
	// Made new (O_EXCL, no link followed) and given away by its open file:
	// the directory is the server's user's already, and a path could be
	// made a link to a file of root's in between.
	pwfile := filepath.Join(c.dir, "pwfile")
	f, err := os.OpenFile(pwfile, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("initdb: password file: %w", err)
	}
	defer os.Remove(pwfile)
	if c.cred != nil {
		if err := f.Chown(int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			_ = f.Close()
			return fmt.Errorf("initdb: give password file to postgres: %w", err)
		}
	}
	_, err = f.WriteString(c.pass + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("initdb: password file: %w", err)
	}
	if err := c.run(2*time.Minute, "initdb", "-D", c.dataDir(), "-U", "postgres", "--pwfile="+pwfile, "--auth=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	return nil
}

func (c *Cluster) start() error {
	c.forgetDead()
	if c.running {
		return nil
	}
	fsync := "off"
	if c.opts.fsync {
		fsync = "on"
	}
	// What pg_ctl start ran, through the shell as pg_ctl does: the log is
	// opened by the server's user (a root jetsink opening it in a
	// directory of the postgres user's could be led by a link to a file
	// of root's), and exec keeps the pid.
	logFile := filepath.Join(c.dir, "server.log")
	pm, err := c.startPostmaster(logFile,
		filepath.Join(c.bin, "postgres"), "-D", c.dataDir(),
		"-p", strconv.Itoa(c.port),
		"-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync="+fsync,
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB")
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.server = pm
	if err := c.waitReady(pm); err != nil {
		// Stopped, so that neither the next attempt nor a removal of the
		// directory leaves it running.
		log, _ := readRegular(logFile, 64<<10, true)
		err = fmt.Errorf("postgres on port %d: %w\nserver log:\n%s", c.port, err, lastLines(string(log), 20))
		if !c.halt() || !c.stopStray() {
			return fmt.Errorf("%w\n%w: %s", err, errStrayRuns, c.strayStays())
		}
		return err
	}
	c.running = true
	return nil
}

// startPostmaster starts the server, the command line argv (postgres and
// its arguments) with its output appended to logFile, as a child of this process that the kernel sends
// SIGQUIT (PostgreSQL's immediate shutdown: the data is throwaway) when
// this process ends, even by SIGKILL. (pg_ctl start detached the server,
// which ran on after a killed jetsink, with its port and its password.)
// A goroutine reaps it; c.reap waits for that.
//
// The signal comes when the thread that started the server ends, not the
// process: the goroutine stays locked to that thread until the server has
// ended, so that no other goroutine runs there, and none can end it by
// exiting locked to it. Go sets the signal (PR_SET_PDEATHSIG) after
// switching to the server's user, which would clear it.
func (c *Cluster) startPostmaster(logFile string, argv ...string) (*postmaster, error) {
	cmd := c.command(context.Background(), nil, "/bin/sh",
		append([]string{"-c", `log=$1; shift; exec "$@" >>"$log" 2>&1`, "sh", logFile}, argv...)...)
	dieWithParent(cmd.SysProcAttr, syscall.SIGQUIT)
	var stderr strings.Builder // the shell's, should it fail before exec
	cmd.Stderr = &stderr
	pm := &postmaster{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(pm.done)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		pm.proc = cmd.Process
		started <- nil
		pm.err = cmd.Wait()
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			pm.err = fmt.Errorf("%w: %s", pm.err, msg)
		}
	}()
	if err := <-started; err != nil {
		<-pm.done
		return nil, err
	}
	return pm, nil
}

// waitReady waits until the server pm accepts connections: until its
// postmaster.pid, with its pid, says "ready" (or "standby", a standby
// that takes read-only connections), which is what pg_ctl start -w waits
// for. Its error says when the server ended first, or took longer than
// the cluster's ready timeout.
func (c *Cluster) waitReady(pm *postmaster) error {
	timeout := cmp.Or(c.opts.ready, readyTimeout)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if status := c.pmStatus(pm.proc.Pid); status == "ready" || status == "standby" {
			return nil
		}
		select {
		case <-pm.done:
			return fmt.Errorf("the server ended before it accepted connections: %w", pm.err)
		case <-deadline.C:
			return fmt.Errorf("the server did not accept connections within %v", timeout)
		case <-tick.C:
		}
	}
}

// pmStatus is the status line of postmaster.pid ("starting", "ready",
// "standby", "stopping"), when its first line is pid; "" otherwise.
func (c *Cluster) pmStatus(pid int) string {
	b, err := readRegular(filepath.Join(c.dataDir(), "postmaster.pid"), 4<<10, false)
	if err != nil {
		return ""
	}
	// pid, data directory, start time, port, socket directory, listen
	// address, shared memory key, status.
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(pid) {
		return ""
	}
	return strings.TrimSpace(lines[7])
}

// reap waits up to d for the server this process started to be reaped,
// and reports whether it has been (true too when there is none).
func (c *Cluster) reap(d time.Duration) bool {
	if c.server == nil {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.server.done:
		c.server = nil
		return true
	case <-t.C:
		return false
	}
}

// halt stops the server this process started, if it still runs, by
// SIGQUIT (immediate shutdown, which stops its children too), then
// SIGKILL, and reports whether it has ended and been reaped.
func (c *Cluster) halt() bool {
	for _, sig := range []os.Signal{syscall.SIGQUIT, syscall.SIGKILL} {
		if c.reap(0) {
			return true
		}
		_ = c.server.proc.Signal(sig) // os.ErrProcessDone once reaped: no other process is signalled
		if c.reap(10 * time.Second) {
			return true
		}
	}
	return false
}

// forgetDead notes a server that died by itself (the OOM killer, a
// kill -9) as not running, and removes the lock files it left (the data
// directory's and its socket's): they name a process that is gone,
// another one now, or a zombie not yet reaped, and a new server refuses
// to start while that process exists.
func (c *Cluster) forgetDead() {
	if c.running && !c.strayRuns() {
		c.running = false
		c.halt() // reaped: a server whose postmaster.pid is gone is stopped too
		_ = os.Remove(filepath.Join(c.dataDir(), "postmaster.pid"))
		_ = os.Remove(filepath.Join(c.dir, ".s.PGSQL."+strconv.Itoa(c.port)+".lock"))
	}
}

// errStrayRuns: a server that failed to start still runs in its data
// directory, and stopStray could not stop it.
var errStrayRuns = errors.New("the server that failed to start could not be stopped")

// stopStray stops a server running in the data directory whatever
// c.running says: one that came up after start gave up waiting, or an
// orphan's (see sweepOrphans). It reads the pid from postmaster.pid and
// leaves alone a live process whose command line does not name the data
// directory (the pid was reused). It tries pg_ctl stop -m immediate, then
// SIGKILL, and reports whether the server is gone.
func (c *Cluster) stopStray() bool {
	if !c.strayRuns() {
		return true
	}
	pid := c.PID()
	if err := c.run(30*time.Second, "pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "30", "stop"); err == nil {
		return true
	}
	if !processAlive(pid) || !runsIn(pid, c.dataDir()) {
		return true
	}
	_ = syscall.Kill(pid, syscall.SIGKILL) // its children exit when they see the postmaster gone
	// Wait, for a caller that removes the directory only once the server
	// is gone. A zombie no longer names the directory (its command line is
	// empty), so an unreaped postmaster counts as gone.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !processAlive(pid) || !runsIn(pid, c.dataDir()) {
			return true
		}
	}
	return false
}

// strayStays says, for an error, that the server stopStray could not stop
// keeps its directory, and what to do about it.
func (c *Cluster) strayStays() string {
	pid := c.PID()
	return fmt.Sprintf("the server (pid %d) still runs, even after SIGKILL, so its directory %s stays: "+
		"the first StartPostgres after this process ends stops and removes them, or kill -9 %d and remove it yourself",
		pid, c.dir, pid)
}

// strayRuns reports whether the pid in the data directory's postmaster.pid
// is alive and runs there.
func (c *Cluster) strayRuns() bool {
	pid := c.PID()
	return pid != 0 && processAlive(pid) && runsIn(pid, c.dataDir())
}

// runsIn reports whether process pid's command line names dataDir; true
// when /proc cannot tell.
func runsIn(pid int, dataDir string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return true
	}
	for _, arg := range strings.Split(string(b), "\x00") {
		if arg == dataDir {
			return true
		}
	}
	return false
}

// run runs one of the PostgreSQL binaries, as the postgres user when root.
func (c *Cluster) run(timeout time.Duration, name string, args ...string) error {
	return c.runEnv(timeout, nil, name, args...)
}

// runEnv is run with env added to the program's environment.
func (c *Cluster) runEnv(timeout time.Duration, env []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := c.command(ctx, env, filepath.Join(c.bin, name), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// command is the command to run path, one of the PostgreSQL programs (or
// the shell that starts one), as the postgres user when root, with env
// added to its environment.
func (c *Cluster) command(ctx context.Context, env []string, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if c.cred != nil {
		// Another user's processes get none of this one's environment
		// (tokens, passwords: the server's user could read them in
		// /proc), only what the programs need.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C", "HOME=" + c.dir, "USER=postgres"}
		for _, k := range []string{"TZ", "LD_LIBRARY_PATH"} { // the libraries of an install without rpath
			if v, ok := os.LookupEnv(k); ok {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
	}
	// A process group of its own: a Ctrl-C at the terminal goes to jetsink,
	// which stops the cluster in its own way, not straight to initdb or
	// the server (killed half-way, "initdb: signal: interrupt", or a
	// server shut down under the drain).
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// minPostgresMajor is the oldest PostgreSQL release jetsink supports.
const minPostgresMajor = 15

// findPostgresBin is the directory of the PostgreSQL server binaries to
// run: that of the pg_ctl on PATH, else the newest of
// /usr/lib/postgresql/<version>/bin (Debian, Ubuntu), the first that holds
// initdb and a postgres of release 15 or newer (an older one is passed
// over). Its error says how to provide PostgreSQL, and names each
// directory passed over and why.
func findPostgresBin() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	for _, m := range newestFirst(matches) {
		dirs = append(dirs, filepath.Dir(m))
	}
	dirs = slices.DeleteFunc(dirs, func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "initdb"))
		return err != nil
	})
	return choosePostgresBin(dirs, postgresMajorIn)
}

// choosePostgresBin returns the first of dirs whose release, as major
// reports it, is minPostgresMajor or newer.
func choosePostgresBin(dirs []string, major func(dir string) (int, error)) (string, error) {
	var passed []string
	for i, dir := range dirs {
		if slices.Contains(dirs[:i], dir) {
			continue // PATH's pg_ctl links into /usr/lib/postgresql
		}
		m, err := major(dir)
		switch {
		case err != nil:
			passed = append(passed, fmt.Sprintf("%s: %v", dir, err))
		case m < minPostgresMajor:
			passed = append(passed, fmt.Sprintf("%s: PostgreSQL %d, older than %d", dir, m, minPostgresMajor))
		default:
			return dir, nil
		}
	}
	if len(passed) > 0 {
		return "", fmt.Errorf("no PostgreSQL %d or newer (%s): %s", minPostgresMajor, strings.Join(passed, "; "), HowToProvidePostgres)
	}
	return "", errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found: " + HowToProvidePostgres)
}

// postgresMajorIn is the major release of the postgres in dir, from its
// --version (which it answers as root too).
func postgresMajorIn(dir string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("postgres --version: %w", err)
	}
	return postgresMajor(string(out))
}

// postgresMajor parses the major release out of postgres --version:
// 15 from "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)", 9 from
// "... 9.6.24", 18 from "... 18devel" or "... 18beta1".
func postgresMajor(version string) (int, error) {
	const tag = "(PostgreSQL) "
	_, rest, ok := strings.Cut(version, tag)
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	m, err := strconv.Atoi(rest[:end])
	if !ok || err != nil {
		return 0, fmt.Errorf("no release number in postgres --version output %q", strings.TrimSpace(version))
	}
	return m, nil
}

// newestFirst sorts paths /usr/lib/postgresql/<version>/bin/<name> by
// version, newest first: by number, as 9.6 sorts after 15 as text.
func newestFirst(paths []string) []string {
	version := func(p string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(p))), 64)
		return v
	}
	slices.SortStableFunc(paths, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	return paths
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stopOrphan stops the server of an orphaned cluster directory (see
// sweepOrphans), if one still runs there. It reports false when one may
// still run: the directory must stay.
func stopOrphan(dir string) bool {
	c := &Cluster{dir: dir}
	bin, err := findPostgresBin()
	if err != nil {
		return !c.strayRuns() // cannot stop it: keep its directory while it runs
	}
	cred, err := postgresCredential()
	if err != nil {
		return !c.strayRuns()
	}
	c.bin, c.cred = bin, cred
	return c.stopStray()
}

// postgresCredential is the user to run PostgreSQL as: the "postgres" user
// when this process is root (PostgreSQL refuses root), nil otherwise.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses root, but there is no user %q to run it as (%v); create it (useradd -r postgres) or %s", "postgres", err, HowToProvidePostgres)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
