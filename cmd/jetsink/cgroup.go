package main

import (
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// cgroupLimit is the memory limit of the cgroup that holds this process.
type cgroupLimit struct {
	bytes int64  // 0: none
	file  string // the file that set it, under the root it was read from
}

// cgroupNoLimit is a limit file's value at and above which cgroup v1 means
// no limit: it shows "unlimited" as the largest page-aligned int64
// (9223372036854771712 with 4 KiB pages).
const cgroupNoLimit = 1 << 62

// readCgroupLimit finds the memory limit that applies to this process: the
// lowest of its cgroup's limit files and of its parents' up to the top of
// the mount that shows them (a container usually sees only its own cgroup,
// at "/" of the mount; a service on a host sees its slices, whose limits
// apply too). The cgroup comes from proc/self/cgroup: a v1 hierarchy with
// the memory controller takes precedence (hybrid hosts), else the v2 one
// ("0::/path"). Its directory is found from proc/self/mountinfo: the first
// cgroup2 mount (v1: cgroup mount with the memory option) whose root holds
// the cgroup, the way Go's runtime finds the CPU cgroup for GOMAXPROCS.
// The files: memory.max and memory.high for v2 ("max": none; above
// memory.high the kernel throttles and reclaims, which would come before
// an OOM kill at memory.max), memory.limit_in_bytes for v1 (cgroupNoLimit
// and above: none). A file that does not exist is skipped (a cgroup
// hierarchy's root has none).
//
// Every path is read under root, "/" outside tests. No limit found is
// cgroupLimit{} and a nil error; any file that cannot be read or parsed is
// an error (the caller treats it as no limit).
func readCgroupLimit(root string) (cgroupLimit, error) {
	mnt, dir, v1, err := findCgroup(root, "memory")
	if err != nil {
		return cgroupLimit{}, err
	}
	files := []string{"memory.max", "memory.high"}
	if v1 {
		files = []string{"memory.limit_in_bytes"}
	}
	var lim cgroupLimit
	for d := range cgroupAncestors(mnt, dir) {
		for _, f := range files {
			path := filepath.Join(d, f)
			n, err := readLimitFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return cgroupLimit{}, err
			}
			if n > 0 && (lim.bytes == 0 || n < lim.bytes) {
				lim = cgroupLimit{bytes: n, file: path}
			}
		}
	}
	return lim, nil
}

// findCgroup returns the directory of this process's cgroup for controller
// ("memory", "cpu"), under root, the mount point that shows it, and whether
// it is a v1 hierarchy's. See readCgroupLimit.
func findCgroup(root, controller string) (mnt, dir string, v1 bool, err error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return "", "", false, err
	}
	cgroup, v1, err := controllerCgroup(string(b), controller)
	if err != nil {
		return "", "", false, err
	}
	b, err = os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return "", "", false, err
	}
	mnt, rel, err := cgroupDir(string(b), cgroup, controller, v1)
	if err != nil {
		return "", "", false, err
	}
	mnt, dir = filepath.Join(root, mnt), filepath.Join(root, mnt, rel)
	if _, err := os.Stat(dir); err != nil {
		return "", "", false, err // moved to another cgroup since, say
	}
	return mnt, dir, v1, nil
}

// cgroupAncestors yields dir, then its parents up to mnt, the top of the
// mount that shows them (dir is mnt or under it).
func cgroupAncestors(mnt, dir string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for d := dir; ; d = filepath.Dir(d) {
			if !yield(d) || d == mnt || !strings.HasPrefix(d, mnt+string(filepath.Separator)) {
				return
			}
		}
	}
}

// controllerCgroup returns the process's cgroup for controller ("memory",
// "cpu") from the text of /proc/self/cgroup ("hierarchy-ID:controllers:path"
// lines) and whether it is in a v1 hierarchy.
func controllerCgroup(text, controller string) (path string, v1 bool, err error) {
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/") {
			return "", false, fmt.Errorf("/proc/self/cgroup: malformed line %q", line)
		}
		switch {
		case f[0] != "0" && slices.Contains(strings.Split(f[1], ","), controller):
			return f[2], true, nil
		case f[0] == "0" && f[1] == "":
			path = f[2] // a v1 line with the controller may follow
		}
	}
	if path == "" {
		return "", false, fmt.Errorf("/proc/self/cgroup: in no %s cgroup", controller)
	}
	return path, false, nil
}

// cgroupDir returns, from the text of /proc/self/mountinfo, the mount point
// of the cgroup hierarchy that shows cgroup (v1: the hierarchy with
// controller among its mount options, "cpu" in "rw,cpu,cpuacct") and the
// cgroup's directory relative to it ("" when the mount's root is the cgroup
// itself, as in a container with its own cgroup namespace).
func cgroupDir(text, cgroup, controller string, v1 bool) (mnt, rel string, err error) {
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		// 36 35 98:0 /root /mount/point rw,relatime shared:1 - cgroup2 cgroup2 rw
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			return "", "", fmt.Errorf("/proc/self/mountinfo: malformed line %q", line)
		}
		if v1 {
			if g[0] != "cgroup" || !slices.Contains(strings.Split(g[2], ","), controller) {
				continue
			}
		} else if g[0] != "cgroup2" {
			continue
		}
		root, mnt := unescapeMountPath(f[3]), unescapeMountPath(f[4])
		rel, ok := strings.CutPrefix(cgroup, root)
		switch {
		case root == "/":
			rel = cgroup
		case !ok || (rel != "" && !strings.HasPrefix(rel, "/")):
			continue // another part of the hierarchy
		}
		if rel == "/.." || strings.HasPrefix(rel, "/../") {
			continue // outside this cgroup namespace: the mount cannot reach it
		}
		return mnt, rel, nil
	}
	kind := "cgroup2"
	if v1 {
		kind = "cgroup v1 " + controller
	}
	return "", "", fmt.Errorf("/proc/self/mountinfo: no %s mount shows %s", kind, cgroup)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readCgroupFile reads a cgroup interface file of one value, trimmed.
func readCgroupFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// readLimitFile reads a cgroup memory limit file: 0 for none ("max", or
// cgroupNoLimit and above).
func readLimitFile(path string) (int64, error) {
	s, err := readCgroupFile(path)
	if err != nil {
		return 0, err
	}
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: not a limit: %q", path, s)
	}
	if n >= cgroupNoLimit {
		return 0, nil
	}
	return n, nil
}

// cpuQuota is the CPU bandwidth limit of the cgroup that holds this
// process: quota microseconds of CPU time in every period.
type cpuQuota struct {
	cpus float64 // quota / period; 0: none
	// file is the limit file that set it, under the root it was read from,
	// raw what it holds: "150000 100000" in cpu.max (v2), "150000" in
	// cpu.cfs_quota_us, whose period, in cpu.cfs_period_us beside it, is
	// in period (v1).
	file, raw, period string
	// parent: the quota is a parent cgroup's, not the process's own.
	parent bool
}

// String is the quota as the "cpu" line gives it: "1.5 (/sys/fs/cgroup/cpu.max
// 150000 100000)", or "none".
func (q cpuQuota) String() string {
	if q.cpus == 0 {
		return "none"
	}
	cpus := strings.TrimRight(strings.TrimRight(strconv.FormatFloat(q.cpus, 'f', 2, 64), "0"), ".")
	if cpus == "0" { // under 0.005 CPUs: two significant digits (0.004)
		cpus = strconv.FormatFloat(q.cpus, 'g', 2, 64)
	}
	if q.period != "" {
		return fmt.Sprintf("%s (%s %s, cpu.cfs_period_us %s)", cpus, q.file, q.raw, q.period)
	}
	return fmt.Sprintf("%s (%s %s)", cpus, q.file, q.raw)
}

// readCPUQuota finds the CPU quota that applies to this process, as
// readCgroupLimit finds the memory limit: the lowest (in CPUs) of its cpu
// cgroup's and its parents' up to the top of the mount. The files: cpu.max
// for v2 ("max <period>": none), cpu.cfs_quota_us and cpu.cfs_period_us for
// v1 (a quota of -1: none). No quota found is cpuQuota{} and a nil error;
// any file that cannot be read or parsed is an error (the caller treats it
// as no quota).
func readCPUQuota(root string) (cpuQuota, error) {
	mnt, dir, v1, err := findCgroup(root, "cpu")
	if err != nil {
		return cpuQuota{}, err
	}
	var lowest cpuQuota
	for d := range cgroupAncestors(mnt, dir) {
		q, err := readCPUQuotaIn(d, v1)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a hierarchy's root has no cpu.max
		}
		if err != nil {
			return cpuQuota{}, err
		}
		if q.cpus > 0 && (lowest.cpus == 0 || q.cpus < lowest.cpus) {
			lowest = q
			lowest.parent = d != dir
		}
	}
	return lowest, nil
}

// readCPUQuotaIn reads the quota of the cgroup directory dir.
func readCPUQuotaIn(dir string, v1 bool) (cpuQuota, error) {
	if v1 {
		qf := filepath.Join(dir, "cpu.cfs_quota_us")
		quota, err := readCPUFile(qf)
		if err != nil || quota < 0 {
			return cpuQuota{}, err
		}
		period, err := readCPUFile(filepath.Join(dir, "cpu.cfs_period_us"))
		if err != nil {
			return cpuQuota{}, err
		}
		if quota == 0 || period <= 0 {
			return cpuQuota{}, fmt.Errorf("%s: not a quota: %d in a period of %d", qf, quota, period)
		}
		return cpuQuota{cpus: float64(quota) / float64(period), file: qf,
			raw: strconv.FormatInt(quota, 10), period: strconv.FormatInt(period, 10)}, nil
	}
	path := filepath.Join(dir, "cpu.max")
	raw, err := readCgroupFile(path)
	if err != nil {
		return cpuQuota{}, err
	}
	q, p, ok := strings.Cut(raw, " ")
	period, perr := strconv.ParseInt(p, 10, 64)
	if !ok || perr != nil || period <= 0 {
		return cpuQuota{}, fmt.Errorf("%s: not a quota and a period: %q", path, raw)
	}
	if q == "max" {
		return cpuQuota{}, nil
	}
	quota, err := strconv.ParseInt(q, 10, 64)
	if err != nil || quota <= 0 {
		return cpuQuota{}, fmt.Errorf("%s: not a quota and a period: %q", path, raw)
	}
	return cpuQuota{cpus: float64(quota) / float64(period), file: path, raw: raw}, nil
}

// readCPUFile reads a cgroup v1 CPU bandwidth file: a number of
// microseconds.
func readCPUFile(path string) (int64, error) {
	s, err := readCgroupFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: not a number of microseconds: %q", path, s)
	}
	return n, nil
}

// logCPU logs the "cpu" line at start-up: GOMAXPROCS, the cgroup's CPU
// quota (readCPUQuota under root; "none" if it finds none or fails, which
// it logs at Debug, as memory_limit: auto does) and the CPUs the process
// may run on. Go's runtime sets GOMAXPROCS from the quota (rounded up, at
// least 2) but does not say what the quota is: a figure measured under
// docker run --cpus=1.5 cannot be read, nor reproduced, without it
// (jetsink bench's report reads this line). gomaxprocs_from says when
// GOMAXPROCS does not follow the quota.
func logCPU(root string, log *slog.Logger) {
	q, err := readCPUQuota(root)
	if err != nil {
		log.Debug("cpu: no cgroup CPU quota read", "err", err)
	}
	procs := runtime.GOMAXPROCS(0)
	attrs := []any{"gomaxprocs", procs, "cpu_quota", q.String(), "numcpu", runtime.NumCPU()}
	if from := gomaxprocsFrom(q, procs); from != "" {
		attrs = append(attrs, "gomaxprocs_from", from)
	}
	log.Info("cpu", attrs...)
}

// gomaxprocsFrom says why GOMAXPROCS (procs) does not follow the quota q,
// when it does not: the GOMAXPROCS variable (which the runtime takes as it
// is when it is a positive 32-bit number), GODEBUG containermaxprocs 0 or
// less (the last setting wins, as the runtime reads it; one built in with a //go:debug
// line is not seen here), or a quota on a parent cgroup that would give
// fewer than procs (the runtime reads the process's own cgroup's only).
func gomaxprocsFrom(q cpuQuota, procs int) string {
	// Parsed as the runtime parses them (proc.go's schedinit, runtime1.go's
	// parsegodebug): a 32-bit number; GODEBUG's fields split at ',' with no
	// space trimmed, the last one that parses winning.
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 32); err == nil && n > 0 {
			if q.cpus == 0 {
				return "the GOMAXPROCS environment variable (" + v + ")"
			}
			return "the GOMAXPROCS environment variable (" + v + "), not the CPU quota"
		}
	}
	var cmp int64 = 1 // the runtime's default: the quota followed
	for s := range strings.SplitSeq(os.Getenv("GODEBUG"), ",") {
		if v, ok := strings.CutPrefix(s, "containermaxprocs="); ok {
			if n, err := strconv.ParseInt(v, 10, 32); err == nil {
				cmp = n
			}
		}
	}
	if cmp <= 0 && q.cpus > 0 && !q.parent { // the runtime reads no parent's quota: GODEBUG changes nothing then
		return "the CPUs: GODEBUG containermaxprocs=" + strconv.FormatInt(cmp, 10) + " turns the CPU quota off for it"
	}
	// The runtime's rounding: up, and at least 2.
	if n := max(int(math.Ceil(q.cpus)), 2); q.parent && n < procs {
		return fmt.Sprintf("not cpu_quota, a parent cgroup's, which Go's runtime does not read (it reads the process's own cgroup's): following it would give %d", n)
	}
	return ""
}
