package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return cgroupLimit{}, err
	}
	cgroup, v1, err := memoryCgroup(string(b))
	if err != nil {
		return cgroupLimit{}, err
	}
	b, err = os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return cgroupLimit{}, err
	}
	mnt, dir, err := cgroupDir(string(b), cgroup, v1)
	if err != nil {
		return cgroupLimit{}, err
	}
	mnt, dir = filepath.Join(root, mnt), filepath.Join(root, mnt, dir)
	if _, err := os.Stat(dir); err != nil {
		return cgroupLimit{}, err // moved to another cgroup since, say
	}
	files := []string{"memory.max", "memory.high"}
	if v1 {
		files = []string{"memory.limit_in_bytes"}
	}
	var lim cgroupLimit
	for d := dir; ; d = filepath.Dir(d) {
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
		if d == mnt || !strings.HasPrefix(d, mnt+string(filepath.Separator)) {
			return lim, nil
		}
	}
}

// memoryCgroup returns the process's memory cgroup from the text of
// /proc/self/cgroup ("hierarchy-ID:controllers:path" lines) and whether it
// is in a v1 hierarchy.
func memoryCgroup(text string) (path string, v1 bool, err error) {
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
		case f[0] != "0" && slices.Contains(strings.Split(f[1], ","), "memory"):
			return f[2], true, nil
		case f[0] == "0" && f[1] == "":
			path = f[2] // a v1 memory line may follow
		}
	}
	if path == "" {
		return "", false, errors.New("/proc/self/cgroup: in no memory cgroup")
	}
	return path, false, nil
}

// cgroupDir returns, from the text of /proc/self/mountinfo, the mount point
// of the cgroup hierarchy that shows cgroup and the cgroup's directory
// relative to it ("" when the mount's root is the cgroup itself, as in a
// container with its own cgroup namespace).
func cgroupDir(text, cgroup string, v1 bool) (mnt, rel string, err error) {
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
			if g[0] != "cgroup" || !slices.Contains(strings.Split(g[2], ","), "memory") {
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
		kind = "cgroup v1 memory"
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

// readLimitFile reads a cgroup memory limit file: 0 for none ("max", or
// cgroupNoLimit and above).
func readLimitFile(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
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
