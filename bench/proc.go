package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jetsink/jetsink/embedded"
)

// child is a jetsink (or baseline) subprocess.
type child struct {
	cmd     *exec.Cmd
	started time.Time
	out     *tailBuffer
	done    chan struct{} // closed when the process has exited
	err     error         // Wait's error, valid after done
	mem     *memSampler
}

// Usage is what the kernel accounted to a child process.
type Usage struct {
	CPU     time.Duration // user + system, from the exited child's rusage
	PeakRSS int64         // bytes: VmHWM of the child's own address space
	// Mem is the highest of the resident set's parts sampled while the
	// child ran (see MemPeaks); zero where /proc has no RssAnon.
	Mem MemPeaks
}

// MemPeaks splits a process's peak resident set into its parts, as
// /proc/<pid>/status gives them (RssAnon + RssFile + RssShmem = VmRSS),
// each the highest sampled (every memEvery, and once more where VmHWM is
// read), in bytes. Anon is the process's own memory: for a Go program its
// heap, stacks and the runtime's metadata. File is pages of mapped files,
// for jetsink its executable's: how many of them the kernel maps on a
// fault depends on how they entered the page cache (a binary read whole,
// by cp or sha256sum, sits in large folios mapped whole), so it moves
// with the host's state, not the code's. VmHWM holds both.
type MemPeaks struct {
	Anon       int64 // the highest RssAnon
	FileAtAnon int64 // RssFile in the sample of the highest RssAnon
	File       int64 // the highest RssFile
	Shmem      int64 // the highest RssShmem
}

// add counts a sample.
func (p *MemPeaks) add(m memStatus) {
	if m.anon > p.Anon {
		p.Anon, p.FileAtAnon = m.anon, m.file
	}
	p.File = max(p.File, m.file)
	p.Shmem = max(p.Shmem, m.shmem)
}

// startChild starts exe args with the JETSINK_* and OTEL_* variables
// removed from the environment (the generated config is the whole truth):
// an OTEL_EXPORTER_OTLP_ENDPOINT left in the shell would have jetsink
// trace every event, and the baseline nothing. A run traces with
// --set (or --matrix) telemetry.otlp_endpoint=...
func startChild(exe string, env []string, args ...string) (*child, error) {
	cmd := exec.Command(exe, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "JETSINK_") && !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...) // later entries win
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	// A process group of its own: Ctrl-C on a terminal signals the whole
	// foreground group, and the engine would begin its drain on it; then
	// stop's SIGTERM, a moment later, would be its second signal and cut
	// the drain short (exit 130). The bench alone stops its children
	// (on a closed terminal's SIGHUP too, which no longer reaches them);
	// should it die without doing so (SIGKILL), they get SIGTERM and drain.
	cmd.SysProcAttr = childAttr()
	c := &child{cmd: cmd, out: out, done: make(chan struct{})}
	c.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", exe, err)
	}
	children.add(c)
	go func() {
		c.err = cmd.Wait()
		children.remove(c)
		close(c.done)
	}()
	c.mem = sampleMem(cmd.Process.Pid, memEvery, c.done)
	return c, nil
}

// children are the subprocesses running now, for KillChildren.
var children liveChildren

type liveChildren struct {
	mu sync.Mutex
	m  map[*child]struct{}
}

func (l *liveChildren) add(c *child) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[*child]struct{})
	}
	l.m[c] = struct{}{}
}

func (l *liveChildren) remove(c *child) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, c)
}

// KillChildren kills the jetsink and baseline processes a bench runs now,
// for a caller about to exit without the clean-up Run does (a second
// signal): a child left behind would go on holding its consumer and
// connections, or consuming, with nobody to stop it. It does not wait.
func KillChildren() {
	children.mu.Lock()
	defer children.mu.Unlock()
	for c := range children.m {
		_ = c.cmd.Process.Kill()
	}
}

// tempDirPrefix starts the name of the directory Run writes the engines'
// configuration files in (in os.TempDir()).
const tempDirPrefix = "jetsink-bench-"

// tempDirs are the directories of the runs under way, for RemoveTempDirs.
var tempDirs liveDirs

type liveDirs struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (l *liveDirs) add(dir string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string]struct{})
	}
	l.m[dir] = struct{}{}
}

func (l *liveDirs) remove(dir string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, dir)
}

// makeTempDir makes the directory for the engines' configuration files,
// which hold the servers' URLs and NATS credentials: only this user may
// enter it, and it is marked as this process's (embedded.TempDir), so that
// the next bench removes it if this one dies without doing so (SIGKILL).
// RemoveTempDirs removes it after a second signal; removeTempDir when the
// run is over.
func makeTempDir() (string, error) {
	dir, err := embedded.TempDir(tempDirPrefix)
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	tempDirs.add(dir)
	return dir, nil
}

// removeTempDir removes a directory makeTempDir made.
func removeTempDir(dir string) {
	tempDirs.remove(dir)
	_ = embedded.RemoveTempDir(dir)
}

// RemoveTempDirs removes the temporary directories of the runs under way,
// whose configuration files hold the servers' URLs and NATS credentials,
// for a caller about to exit without the clean-up Run does (a second
// signal), after KillChildren: the engines read their files at start. A
// bench that dies without either (SIGKILL) leaves its directory to the
// next bench, which removes it.
func RemoveTempDirs() {
	tempDirs.mu.Lock()
	defer tempDirs.mu.Unlock()
	for dir := range tempDirs.m {
		_ = embedded.RemoveTempDir(dir)
		delete(tempDirs.m, dir)
	}
}

// memStatus is what /proc/<pid>/status says of a process's memory, in
// bytes.
type memStatus struct {
	rss, hwm          int64 // VmRSS, VmHWM
	anon, file, shmem int64 // RssAnon, RssFile, RssShmem: their sum is VmRSS
	split             bool  // the Rss* lines were there (Linux 4.5 on)
}

// readMemStatus reads pid's memStatus; ok is false if the process is gone
// (or exited: a zombie has no VmRSS) or /proc is not there.
func readMemStatus(pid int) (memStatus, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return memStatus{}, false
	}
	return parseMemStatus(b)
}

// parseMemStatus reads the memory lines of a /proc/<pid>/status ("VmRSS:
// 123 kB"); ok when it has VmRSS.
func parseMemStatus(b []byte) (m memStatus, ok bool) {
	var rss, anon bool
	for line := range bytes.Lines(b) {
		name, rest, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		var field *int64
		switch string(name) {
		case "VmRSS":
			field, rss = &m.rss, true
		case "VmHWM":
			field = &m.hwm
		case "RssAnon":
			field, anon = &m.anon, true
		case "RssFile":
			field = &m.file
		case "RssShmem":
			field = &m.shmem
		default:
			continue
		}
		kb, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("kB")))), 10, 64)
		if err != nil {
			return memStatus{}, false
		}
		*field = kb << 10
	}
	m.split = anon
	return m, rss
}

// memEvery is how often a memSampler reads the child's status: as often
// as waitAcked asks for the consumer's state. A read costs the bench
// process some tens of µs, none of it the child's.
const memEvery = 25 * time.Millisecond

// memSampler keeps the peaks of a child's memory parts (MemPeaks), read
// from /proc/<pid>/status every so often until stopped or the child has
// exited. VmHWM is the kernel's own peak and needs no sampling; its
// parts have none, and a sample misses a peak shorter than the interval.
type memSampler struct {
	pid    int
	exited <-chan struct{} // closed once the child is reaped
	tick   *ticking

	mu    sync.Mutex
	peaks MemPeaks
}

// sampleMem starts sampling pid every interval until stop, or until exited
// is closed.
func sampleMem(pid int, every time.Duration, exited <-chan struct{}) *memSampler {
	s := &memSampler{pid: pid, exited: exited}
	s.tick = startTicking(every, exited, func() { s.sample() })
	return s
}

// ticking runs a function at once and then every interval, on a goroutine
// of its own, until halted or until exited is closed (nil: never).
type ticking struct {
	stopc chan struct{}
	once  sync.Once
	done  chan struct{}
}

func startTicking(every time.Duration, exited <-chan struct{}, f func()) *ticking {
	t := &ticking{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			f()
			select {
			case <-tk.C:
			case <-t.stopc:
				return
			case <-exited:
				return
			}
		}
	}()
	return t
}

// halt ends the ticking and waits for the function's last run to end.
// Safe to call more than once.
func (t *ticking) halt() {
	t.once.Do(func() { close(t.stopc) })
	<-t.done
}

// sample reads the status once and counts it; it returns what it read.
// Once the child has exited it reads nothing: reaped, its PID may be
// another process's. (Reaped between the look and the read, its PID would
// have to be handed out again in those microseconds.)
func (s *memSampler) sample() (memStatus, bool) {
	select {
	case <-s.exited:
		return memStatus{}, false
	default:
	}
	m, ok := readMemStatus(s.pid)
	if !ok || !m.split {
		return m, ok
	}
	s.mu.Lock()
	s.peaks.add(m)
	s.mu.Unlock()
	return m, ok
}

// stop ends the sampling, takes a last sample while the child has not
// exited, and returns the peaks and the last sample's VmHWM (0 when it
// could not be read, or the child had exited).
func (s *memSampler) stop() (MemPeaks, int64) {
	s.tick.halt()
	m, _ := s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peaks, m.hwm
}

// stop sends SIGTERM (jetsink drains and exits 0), waits up to grace, then
// kills. It returns the child's CPU over its whole life, and its VmHWM and
// the peaks of its memory's parts read just before the signal.
func (c *child) stop(grace time.Duration) (Usage, error) {
	mem, hwm := c.mem.stop()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	var exitErr error
	select {
	case <-c.done:
		exitErr = c.err
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
		exitErr = fmt.Errorf("did not exit %v after SIGTERM; killed", grace)
	}
	return c.usage(hwm, mem), exitErr
}

// usage reads the rusage of an exited child.
func (c *child) usage(hwm int64, mem MemPeaks) Usage {
	u := Usage{PeakRSS: hwm, Mem: mem}
	ps := c.cmd.ProcessState
	if ps == nil {
		return u
	}
	u.CPU = ps.UserTime() + ps.SystemTime()
	// ru_maxrss survives execve: it starts at the forking parent's RSS (here
	// the bench process with its embedded nats-server), so it is only a
	// fallback when /proc could not be read.
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && u.PeakRSS == 0 {
		u.PeakRSS = int64(ru.Maxrss) // bytes on macOS (int32 on 32-bit Linux)
		if runtime.GOOS != "darwin" {
			u.PeakRSS <<= 10 // kilobytes on Linux and the BSDs
		}
	}
	return u
}

// logged is what c logged at warning level and above, on lines after a
// newline; "" if nothing.
func logged(c *child) string {
	p := c.problems(10)
	if len(p) == 0 {
		return ""
	}
	return "; it logged:\n" + strings.Join(p, "\n")
}

// kill ends the child at once (used on errors).
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
	c.mem.stop()
}

// tailBuffer keeps the last max bytes written to it, and the first
// headMax (see head).
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   bytes.Buffer
	first []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := headMax - len(t.first); n > 0 {
		t.first = append(t.first, p[:min(n, len(p))]...)
	}
	t.buf.Write(p)
	if n := t.buf.Len(); n > t.max {
		t.buf.Next(n - t.max)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// problems returns the engine's warning and error log lines (text or JSON
// slog format) from the tail of its output, at most max of them.
func (c *child) problems(max int) []string {
	var out []string
	for _, line := range strings.Split(c.out.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") ||
			strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			if len(out) == max {
				break
			}
			out = append(out, line)
		}
	}
	return out
}

// loadAvg1 is the one-minute load average from /proc/loadavg; -1 if unknown.
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// cpuSample is the machine's CPU time (all CPUs, from /proc/stat), this
// process's own (user+sys) and, for an embedded PostgreSQL, the server's at
// one moment.
type cpuSample struct {
	at time.Time
	// The machine's: busy = user+nice+system+irq+softirq, idle =
	// idle+iowait, steal = what the hypervisor gave other guests while a
	// CPU of this one's waited (on a VM), in neither: no process here ran.
	busy, idle, steal time.Duration
	self              time.Duration // this process (the embedded nats-server lives here)
	pg                time.Duration // the postmaster and its children, live and reaped
	pgOK              bool
}

// sampleCPU reads a cpuSample; ok is false where /proc/stat is missing.
// pgPID is the embedded postmaster's process ID, or 0.
func sampleCPU(pgPID int) (s cpuSample, ok bool) {
	s.at = time.Now()
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if pgPID > 0 {
		s.pg, s.pgOK = treeCPU(pgPID)
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	s.busy, s.idle, s.steal, ok = parseCPULine(line)
	return s, ok
}

// parseCPULine reads /proc/stat's first line, the "cpu" total of every
// CPU: busy, idle and steal time as cpuSample has them.
func parseCPULine(line string) (busy, idle, steal time.Duration, ok bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, false
	}
	var v [8]float64 // user nice system idle iowait irq softirq steal, in clock ticks
	for i := range v {
		var err error
		if v[i], err = strconv.ParseFloat(f[i+1], 64); err != nil {
			return 0, 0, 0, false
		}
	}
	const tick = float64(clockTick)
	busy = time.Duration((v[0] + v[1] + v[2] + v[5] + v[6]) * tick)
	idle = time.Duration((v[3] + v[4]) * tick)
	steal = time.Duration(v[7] * tick)
	return busy, idle, steal, true
}

// treeCPU is the CPU time (user+sys) of process pid, of the children it
// has reaped, and of its live children: for a postmaster, the whole
// server, since backends are its children and it reaps them as they exit.
func treeCPU(pid int) (time.Duration, bool) {
	f, ok := procStat(pid)
	if !ok {
		return 0, false
	}
	total := f.utime + f.stime + f.cutime + f.cstime
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil || child == pid {
			continue
		}
		if c, ok := procStat(child); ok && c.ppid == pid {
			total += c.utime + c.stime
		}
	}
	return time.Duration(total) * clockTick, true
}

// clockTick is the unit of the CPU times in /proc: 1/USER_HZ, and USER_HZ
// is 100 on Linux.
const clockTick = time.Second / 100

type statFields struct {
	ppid                         int
	utime, stime, cutime, cstime int64 // clock ticks
}

// procStat reads the fields of /proc/pid/stat that treeCPU needs.
func procStat(pid int) (statFields, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return statFields{}, false
	}
	// The command name is in parentheses and may hold spaces: the
	// fields after it start with the state (field 3 of proc(5)).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return statFields{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return statFields{}, false
	}
	var s statFields
	var v [5]int64
	for k, idx := range [5]int{1, 11, 12, 13, 14} { // ppid utime stime cutime cstime
		if v[k], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return statFields{}, false
		}
	}
	s.ppid = int(v[0])
	s.utime, s.stime, s.cutime, s.cstime = v[1], v[2], v[3], v[4]
	return s, true
}

type rssSample struct {
	at   time.Time
	rss  int64
	anon int64 // RssAnon; 0 where /proc has none
}

// rssSampler reads a process's VmRSS and RssAnon every interval until
// stopped or the process has exited, and whenever mark is called (not
// once it has exited: reaped, its PID may be another process's). At most
// Options.Timeout long: ~4 samples a second of 32 bytes.
type rssSampler struct {
	pid    int
	exited <-chan struct{} // closed once the child is reaped
	tick   *ticking

	mu      sync.Mutex
	samples []rssSample
}

func sampleRSS(pid int, every time.Duration, exited <-chan struct{}) *rssSampler {
	s := &rssSampler{pid: pid, exited: exited}
	s.tick = startTicking(every, exited, s.mark)
	return s
}

// mark takes a sample now, unless the process has exited. Safe from any
// goroutine.
func (s *rssSampler) mark() {
	select {
	case <-s.exited:
		return
	default:
	}
	m, ok := readMemStatus(s.pid)
	if !ok {
		return
	}
	s.mu.Lock()
	s.samples = append(s.samples, rssSample{time.Now(), m.rss, m.anon})
	s.mu.Unlock()
}

// stop ends the sampling and returns the samples, in time order (each is
// timed under the lock).
func (s *rssSampler) stop() []rssSample {
	s.tick.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// perSecond keeps the highest sample of each second after start, of VmRSS
// and of RssAnon each (samples before start count in second 0).
func perSecond(samples []rssSample, start time.Time) []RSSPoint {
	var out []RSSPoint
	for _, s := range samples {
		ts := max(0, int(s.at.Sub(start)/time.Second))
		if n := len(out); n > 0 && out[n-1].TS == ts {
			out[n-1].RSS = max(out[n-1].RSS, s.rss)
			out[n-1].Anon = max(out[n-1].Anon, s.anon)
			continue
		}
		out = append(out, RSSPoint{TS: ts, RSS: s.rss, Anon: s.anon})
	}
	return out
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
