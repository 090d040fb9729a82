package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fakeRoot writes files (path relative to the root: content) into a new
// directory and returns it.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Lines of /proc/self/mountinfo as a container and a host show them.
const (
	mountsV2Container = "1 0 0:1 / / rw - overlay overlay rw\n" +
		"30 22 0:27 / /sys/fs/cgroup ro,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate\n"
	mountsV2Host = "25 1 0:24 / /proc rw - proc proc rw\n" +
		"30 22 0:27 / /sys/fs/cgroup rw,nosuid shared:5 - cgroup2 cgroup2 rw\n"
	mountsV1 = "30 22 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n" +
		"31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n" +
		"34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
		"40 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
	// 9223372036854771712: cgroup v1's "unlimited" with 4 KiB pages.
	v1Unlimited = "9223372036854771712\n"
)

func TestReadCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		files    map[string]string
		want     int64
		wantFile string // relative to the root
		wantErr  string
	}{
		{
			name: "v2 container with a limit",
			files: map[string]string{
				"proc/self/cgroup":                 "0::/\n",
				"proc/self/mountinfo":              mountsV2Container,
				"sys/fs/cgroup/memory.max":         "268435456\n",
				"sys/fs/cgroup/memory.high":        "max\n",
				"sys/fs/cgroup/memory.current":     "1000\n",
				"sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
			},
			want: 256 << 20, wantFile: "sys/fs/cgroup/memory.max",
		},
		{
			name: "v2 max: none",
			files: map[string]string{
				"proc/self/cgroup":          "0::/\n",
				"proc/self/mountinfo":       mountsV2Container,
				"sys/fs/cgroup/memory.max":  "max\n",
				"sys/fs/cgroup/memory.high": "max\n",
			},
		},
		{
			name: "v2 memory.high below memory.max",
			files: map[string]string{
				"proc/self/cgroup":          "0::/\n",
				"proc/self/mountinfo":       mountsV2Container,
				"sys/fs/cgroup/memory.max":  "268435456\n",
				"sys/fs/cgroup/memory.high": "201326592\n",
			},
			want: 192 << 20, wantFile: "sys/fs/cgroup/memory.high",
		},
		{
			name: "v2 limit on a parent (a host's slice)",
			files: map[string]string{
				"proc/self/cgroup":    "0::/system.slice/jetsink.service\n",
				"proc/self/mountinfo": mountsV2Host,
				"sys/fs/cgroup/system.slice/jetsink.service/memory.max": "max\n",
				"sys/fs/cgroup/system.slice/memory.max":                 "536870912\n",
				"sys/fs/cgroup/cgroup.controllers":                      "memory\n", // the root: no memory.max
			},
			want: 512 << 20, wantFile: "sys/fs/cgroup/system.slice/memory.max",
		},
		{
			name: "v2 the lowest of the cgroup and its parents",
			files: map[string]string{
				"proc/self/cgroup":             "0::/a/b\n",
				"proc/self/mountinfo":          mountsV2Host,
				"sys/fs/cgroup/a/b/memory.max": "134217728\n",
				"sys/fs/cgroup/a/memory.max":   "536870912\n",
			},
			want: 128 << 20, wantFile: "sys/fs/cgroup/a/b/memory.max",
		},
		{
			name: "v2 mount rooted at the cgroup (no cgroup namespace)",
			files: map[string]string{
				"proc/self/cgroup":         "0::/system.slice/docker-1.scope\n",
				"proc/self/mountinfo":      "30 22 0:27 /system.slice/docker-1.scope /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
				"sys/fs/cgroup/memory.max": "268435456\n",
			},
			want: 256 << 20, wantFile: "sys/fs/cgroup/memory.max",
		},
		{
			name: "v2 the mount whose root holds the cgroup",
			files: map[string]string{
				"proc/self/cgroup": "0::/system.slice/jetsink.service\n",
				"proc/self/mountinfo": "29 22 0:27 /user.slice /mnt/user ro - cgroup2 cgroup2 rw\n" +
					"30 22 0:27 /system.slice /mnt/system ro - cgroup2 cgroup2 rw\n",
				"mnt/user/system.slice/jetsink.service/memory.max": "1\n",
				"mnt/system/jetsink.service/memory.max":            "268435456\n",
			},
			want: 256 << 20, wantFile: "mnt/system/jetsink.service/memory.max",
		},
		{
			name: "v2 mount point elsewhere, escaped",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      "30 22 0:27 / /run/my\\040cgroup rw - cgroup2 none rw\n",
				"run/my cgroup/memory.max": "268435456\n",
			},
			want: 256 << 20, wantFile: "run/my cgroup/memory.max",
		},
		{
			name: "v1 with a limit, under a hybrid host's unified line",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/docker/abc\n3:cpu:/\n0::/\n",
				"proc/self/mountinfo":                        mountsV1,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456\n",
				"sys/fs/cgroup/unified/memory.max":           "1\n", // not the memory controller's
			},
			want: 256 << 20, wantFile: "sys/fs/cgroup/memory/memory.limit_in_bytes",
		},
		{
			name: "v1 unlimited",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/docker/abc\n0::/\n",
				"proc/self/mountinfo":                        mountsV1,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": v1Unlimited,
			},
		},
		{
			name: "v1 limit on a parent",
			files: map[string]string{
				"proc/self/cgroup":    "11:memory,hugetlb:/kubepods/pod1/c1\n",
				"proc/self/mountinfo": "34 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,hugetlb\n",
				"sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": v1Unlimited,
				"sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes":    "268435456\n",
				"sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes":         v1Unlimited,
				"sys/fs/cgroup/memory/memory.limit_in_bytes":                  v1Unlimited,
			},
			want: 256 << 20, wantFile: "sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes",
		},
		{
			name:    "no /proc/self/cgroup",
			files:   map[string]string{"proc/self/mountinfo": mountsV2Container},
			wantErr: "cgroup",
		},
		{
			name: "no mountinfo",
			files: map[string]string{
				"proc/self/cgroup": "0::/\n",
			},
			wantErr: "mountinfo",
		},
		{
			name: "no cgroup2 mount",
			files: map[string]string{
				"proc/self/cgroup":    "0::/\n",
				"proc/self/mountinfo": "1 0 0:1 / / rw - overlay overlay rw\n",
			},
			wantErr: "no cgroup2 mount",
		},
		{
			name: "in no memory cgroup",
			files: map[string]string{
				"proc/self/cgroup":    "3:cpu:/\n",
				"proc/self/mountinfo": mountsV1,
			},
			wantErr: "no memory cgroup",
		},
		{
			name: "the cgroup's directory is missing",
			files: map[string]string{
				"proc/self/cgroup":         "0::/gone\n",
				"proc/self/mountinfo":      mountsV2Host,
				"sys/fs/cgroup/memory.max": "1\n",
			},
			wantErr: "gone",
		},
		{
			name: "no limit files: none",
			files: map[string]string{
				"proc/self/cgroup":                 "0::/\n",
				"proc/self/mountinfo":              mountsV2Container,
				"sys/fs/cgroup/cgroup.controllers": "cpu\n",
			},
		},
		{
			name: "garbage in memory.max",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      mountsV2Container,
				"sys/fs/cgroup/memory.max": "lots\n",
			},
			wantErr: "not a limit",
		},
		{
			name: "negative memory.limit_in_bytes",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/docker/abc\n",
				"proc/self/mountinfo":                        mountsV1,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "-1\n",
			},
			wantErr: "not a limit",
		},
		{
			name: "garbage in a parent's memory.max",
			files: map[string]string{
				"proc/self/cgroup":           "0::/a\n",
				"proc/self/mountinfo":        mountsV2Host,
				"sys/fs/cgroup/a/memory.max": "268435456\n",
				"sys/fs/cgroup/memory.max":   "\x00\x01",
			},
			wantErr: "not a limit",
		},
		{
			name: "garbage /proc/self/cgroup",
			files: map[string]string{
				"proc/self/cgroup":    "hello\n",
				"proc/self/mountinfo": mountsV2Container,
			},
			wantErr: "malformed",
		},
		{
			name: "garbage mountinfo",
			files: map[string]string{
				"proc/self/cgroup":    "0::/\n",
				"proc/self/mountinfo": "30 22 0:27 / /sys/fs/cgroup\n",
			},
			wantErr: "malformed",
		},
		{
			name: "a cgroup outside the namespace",
			files: map[string]string{
				"proc/self/cgroup":         "0::/../../init\n",
				"proc/self/mountinfo":      mountsV2Container,
				"sys/fs/cgroup/memory.max": "1\n",
			},
			wantErr: "no cgroup2 mount",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.files)
			got, err := readCgroupLimit(root)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("limit %+v, error %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantFile := ""
			if tc.wantFile != "" {
				wantFile = filepath.Join(root, tc.wantFile)
			}
			if got.bytes != tc.want || got.file != wantFile {
				t.Errorf("limit %d from %q, want %d from %q", got.bytes, got.file, tc.want, wantFile)
			}
		})
	}
}

func TestSoftLimitUnder(t *testing.T) {
	for _, tc := range []struct{ cg, want int64 }{
		{256 << 20, 256<<20/100*90 - 24<<20}, // 206.4 MiB
		{1 << 30, 1<<30/100*90 - 24<<20},
		{64 << 20, 64<<20/100*90 - 24<<20}, // 33.6 MiB
		{32 << 20, 16 << 20},               // 4.8 MiB: the floor
	} {
		if got := softLimitUnder(tc.cg); got != tc.want {
			t.Errorf("soft limit %d under %d, want %d", got, tc.cg, tc.want)
		}
	}
}

// Lines of /proc/self/mountinfo with cgroup v1's cpu controller, as Docker
// on a v1 host shows them: cpu and cpuacct co-mounted, a separate cpuset.
const mountsV1CPU = "30 22 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n" +
	"32 30 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n" +
	"33 30 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" +
	"34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
	"40 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"

func TestReadCPUQuota(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		want    string // cpuQuota.String with <root> for the root
		parent  bool
		wantErr string
	}{
		{
			name: "v2 container with a quota",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      mountsV2Container,
				"sys/fs/cgroup/cpu.max":    "150000 100000\n",
				"sys/fs/cgroup/memory.max": "max\n",
			},
			want: "1.5 (<root>/sys/fs/cgroup/cpu.max 150000 100000)",
		},
		{
			name: "v2 a quota under 0.005 CPUs: two significant digits, not 0",
			files: map[string]string{
				"proc/self/cgroup":      "0::/\n",
				"proc/self/mountinfo":   mountsV2Container,
				"sys/fs/cgroup/cpu.max": "4000 1000000\n",
			},
			want: "0.004 (<root>/sys/fs/cgroup/cpu.max 4000 1000000)",
		},
		{
			name: "v2 max: none",
			files: map[string]string{
				"proc/self/cgroup":      "0::/\n",
				"proc/self/mountinfo":   mountsV2Container,
				"sys/fs/cgroup/cpu.max": "max 100000\n",
			},
			want: "none",
		},
		{
			name: "v2 no cpu.max (the hierarchy's root): none",
			files: map[string]string{
				"proc/self/cgroup":                 "0::/\n",
				"proc/self/mountinfo":              mountsV2Host,
				"sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
			},
			want: "none",
		},
		{
			name: "v2 quota on a parent (a host's slice)",
			files: map[string]string{
				"proc/self/cgroup":    "0::/system.slice/jetsink.service\n",
				"proc/self/mountinfo": mountsV2Host,
				"sys/fs/cgroup/system.slice/jetsink.service/cpu.max": "max 100000\n",
				"sys/fs/cgroup/system.slice/cpu.max":                 "200000 100000\n",
			},
			want:   "2 (<root>/sys/fs/cgroup/system.slice/cpu.max 200000 100000)",
			parent: true,
		},
		{
			name: "v2 the lowest in CPUs of the cgroup and its parents",
			files: map[string]string{
				"proc/self/cgroup":            "0::/a/b/c\n",
				"proc/self/mountinfo":         mountsV2Host,
				"sys/fs/cgroup/a/b/c/cpu.max": "100000 50000\n", // 2 CPUs in a shorter period
				"sys/fs/cgroup/a/b/cpu.max":   "50000 100000\n",
				"sys/fs/cgroup/a/cpu.max":     "400000 100000\n",
			},
			want:   "0.5 (<root>/sys/fs/cgroup/a/b/cpu.max 50000 100000)",
			parent: true,
		},
		{
			name: "v2 own quota below its parent's",
			files: map[string]string{
				"proc/self/cgroup":          "0::/a/b\n",
				"proc/self/mountinfo":       mountsV2Host,
				"sys/fs/cgroup/a/b/cpu.max": "33333 100000\n",
				"sys/fs/cgroup/a/cpu.max":   "200000 100000\n",
			},
			want: "0.33 (<root>/sys/fs/cgroup/a/b/cpu.max 33333 100000)",
		},
		{
			name: "v2 the mount rooted at the cgroup",
			files: map[string]string{
				"proc/self/cgroup":      "0::/system.slice/docker-1.scope\n",
				"proc/self/mountinfo":   "30 22 0:27 /system.slice/docker-1.scope /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
				"sys/fs/cgroup/cpu.max": "250000 100000\n",
			},
			want: "2.5 (<root>/sys/fs/cgroup/cpu.max 250000 100000)",
		},
		{
			name: "v1 cpu,cpuacct, under a hybrid host's unified line",
			files: map[string]string{
				"proc/self/cgroup":                            "5:cpuset:/docker/abc\n4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
				"proc/self/mountinfo":                         mountsV1CPU,
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":  "150000\n",
				"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
				"sys/fs/cgroup/unified/cpu.max":               "1000 100000\n", // not the cpu controller's
			},
			want: "1.5 (<root>/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us 150000, cpu.cfs_period_us 100000)",
		},
		{
			name: "v1 -1: none",
			files: map[string]string{
				"proc/self/cgroup":                    "1:cpu:/\n2:cpuacct:/\n0::/\n",
				"proc/self/mountinfo":                 mountsV1,
				"sys/fs/cgroup/cpu/cpu.cfs_quota_us":  "-1\n",
				"sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
			},
			want: "none",
		},
		{
			name: "v1 quota on a parent, cpuacct's hierarchy not taken for cpu's",
			files: map[string]string{
				"proc/self/cgroup": "2:cpuacct:/elsewhere\n11:cpu:/kubepods/pod1/c1\n",
				"proc/self/mountinfo": "33 30 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n" +
					"34 30 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
				"sys/fs/cgroup/cpu/kubepods/pod1/c1/cpu.cfs_quota_us":  "-1\n",
				"sys/fs/cgroup/cpu/kubepods/pod1/c1/cpu.cfs_period_us": "100000\n",
				"sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_quota_us":     "250000\n",
				"sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_period_us":    "100000\n",
				"sys/fs/cgroup/cpu/kubepods/cpu.cfs_quota_us":          "-1\n",
				"sys/fs/cgroup/cpu/kubepods/cpu.cfs_period_us":         "100000\n",
				"sys/fs/cgroup/cpu/cpu.cfs_quota_us":                   "-1\n",
				"sys/fs/cgroup/cpu/cpu.cfs_period_us":                  "100000\n",
				"sys/fs/cgroup/cpuacct/elsewhere/cpu.cfs_quota_us":     "1000\n",
			},
			want:   "2.5 (<root>/sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_quota_us 250000, cpu.cfs_period_us 100000)",
			parent: true,
		},
		{
			name: "in no cpu cgroup",
			files: map[string]string{
				"proc/self/cgroup":    "4:memory:/docker/abc\n",
				"proc/self/mountinfo": mountsV1CPU,
			},
			wantErr: "no cpu cgroup",
		},
		{
			name: "v1 no cpu mount",
			files: map[string]string{
				"proc/self/cgroup":    "3:cpu,cpuacct:/docker/abc\n",
				"proc/self/mountinfo": mountsV2Container,
			},
			wantErr: "no cgroup v1 cpu mount",
		},
		{
			name: "garbage in cpu.max",
			files: map[string]string{
				"proc/self/cgroup":      "0::/\n",
				"proc/self/mountinfo":   mountsV2Container,
				"sys/fs/cgroup/cpu.max": "lots\n",
			},
			wantErr: "not a quota",
		},
		{
			name: "cpu.max without a period",
			files: map[string]string{
				"proc/self/cgroup":      "0::/\n",
				"proc/self/mountinfo":   mountsV2Container,
				"sys/fs/cgroup/cpu.max": "150000\n",
			},
			wantErr: "not a quota",
		},
		{
			name: "garbage in a parent's cpu.max",
			files: map[string]string{
				"proc/self/cgroup":        "0::/a\n",
				"proc/self/mountinfo":     mountsV2Host,
				"sys/fs/cgroup/a/cpu.max": "150000 100000\n",
				"sys/fs/cgroup/cpu.max":   "max\n",
			},
			wantErr: "not a quota",
		},
		{
			name: "garbage in cpu.cfs_period_us",
			files: map[string]string{
				"proc/self/cgroup":                    "1:cpu:/\n",
				"proc/self/mountinfo":                 mountsV1,
				"sys/fs/cgroup/cpu/cpu.cfs_quota_us":  "150000\n",
				"sys/fs/cgroup/cpu/cpu.cfs_period_us": "often\n",
			},
			wantErr: "not a number",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.files)
			got, err := readCPUQuota(root)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("quota %v, error %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.ReplaceAll(tc.want, "<root>", root); got.String() != want || got.parent != tc.parent {
				t.Errorf("quota %q (a parent's: %t), want %q (%t)", got, got.parent, want, tc.parent)
			}
		})
	}
}

// The "cpu" line gives GOMAXPROCS, the quota and the CPUs, and says when
// GOMAXPROCS does not follow the quota.
func TestLogCPU(t *testing.T) {
	own := map[string]string{
		"proc/self/cgroup":      "0::/\n",
		"proc/self/mountinfo":   mountsV2Container,
		"sys/fs/cgroup/cpu.max": "150000 100000\n",
	}
	parents := map[string]string{
		"proc/self/cgroup":        "0::/a\n",
		"proc/self/mountinfo":     mountsV2Host,
		"sys/fs/cgroup/a/cpu.max": "max 100000\n",
		"sys/fs/cgroup/cpu.max":   "150000 100000\n",
	}
	unreadable := map[string]string{
		"proc/self/cgroup":      "0::/\n",
		"proc/self/mountinfo":   mountsV2Container,
		"sys/fs/cgroup/cpu.max": "lots\n",
	}
	// The parent's 1.5 CPUs give GOMAXPROCS 2, which is worth noting when
	// GOMAXPROCS is more (a machine with more than 2 CPUs).
	var parentFrom string
	if runtime.GOMAXPROCS(0) > 2 {
		parentFrom = `gomaxprocs_from="not cpu_quota, a parent cgroup's, which Go's runtime does not read (it reads the process's own cgroup's): following it would give 2"`
	}
	gomaxprocs := fmt.Sprintf("msg=cpu gomaxprocs=%d ", runtime.GOMAXPROCS(0))
	numcpu := fmt.Sprintf(" numcpu=%d", runtime.NumCPU())
	for _, tc := range []struct {
		name               string
		files              map[string]string
		gomaxprocsEnv      string
		godebug            string
		quota, from, debug string // from: "" for no gomaxprocs_from
	}{
		{name: "own quota", files: own, quota: `cpu_quota="1.5 (<root>/sys/fs/cgroup/cpu.max 150000 100000)"`},
		{name: "no cgroup", files: map[string]string{}, quota: "cpu_quota=none", debug: "no cgroup CPU quota read"},
		{name: "unreadable: none, said at debug", files: unreadable, quota: "cpu_quota=none", debug: "not a quota"},
		{name: "GOMAXPROCS set", files: own, gomaxprocsEnv: "3", quota: `cpu_quota="1.5 (`,
			from: `gomaxprocs_from="the GOMAXPROCS environment variable (3), not the CPU quota"`},
		{name: "GOMAXPROCS not a number: the runtime ignores it", files: own, gomaxprocsEnv: "lots", quota: `cpu_quota="1.5 (`},
		{name: "GODEBUG containermaxprocs=0", files: own, godebug: "panicnil=0,containermaxprocs=0", quota: `cpu_quota="1.5 (`,
			from: `gomaxprocs_from="the CPUs: GODEBUG containermaxprocs=0`},
		{name: "GODEBUG containermaxprocs=0 then 1", files: own, godebug: "containermaxprocs=0,containermaxprocs=1", quota: `cpu_quota="1.5 (`},
		// As the runtime parses them (a review found these told wrong):
		{name: "GOMAXPROCS past 32 bits: the runtime ignores it", files: own, gomaxprocsEnv: "3000000000", quota: `cpu_quota="1.5 (`},
		{name: "GOMAXPROCS set, no quota", files: map[string]string{}, gomaxprocsEnv: "3", quota: "cpu_quota=none",
			from: `gomaxprocs_from="the GOMAXPROCS environment variable (3)"`, debug: "no cgroup CPU quota read"},
		{name: "GODEBUG containermaxprocs=-1", files: own, godebug: "containermaxprocs=-1", quota: `cpu_quota="1.5 (`,
			from: `gomaxprocs_from="the CPUs: GODEBUG containermaxprocs=-1 turns`},
		{name: "GODEBUG containermaxprocs=00", files: own, godebug: "containermaxprocs=00", quota: `cpu_quota="1.5 (`,
			from: `gomaxprocs_from="the CPUs: GODEBUG containermaxprocs=0 turns`},
		{name: "GODEBUG containermaxprocs=0 then not a number: 0 stays", files: own, godebug: "containermaxprocs=0,containermaxprocs=x",
			quota: `cpu_quota="1.5 (`, from: `gomaxprocs_from="the CPUs: GODEBUG containermaxprocs=0 turns`},
		{name: "GODEBUG with a space before the key: the runtime ignores it", files: own, godebug: "panicnil=0, containermaxprocs=0",
			quota: `cpu_quota="1.5 (`},
		{name: "a parent's quota and GODEBUG containermaxprocs=0: the parent's note, not GODEBUG's", files: parents,
			godebug: "containermaxprocs=0", quota: `cpu_quota="1.5 (<root>/sys/fs/cgroup/cpu.max 150000 100000)"`, from: parentFrom},
		{name: "a parent's quota", files: parents, quota: `cpu_quota="1.5 (<root>/sys/fs/cgroup/cpu.max 150000 100000)"`,
			from: parentFrom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", tc.gomaxprocsEnv)
			t.Setenv("GODEBUG", tc.godebug)
			root := fakeRoot(t, tc.files)
			var out strings.Builder
			logCPU(root, slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
			var line string
			for l := range strings.Lines(out.String()) {
				if strings.Contains(l, "msg=cpu ") {
					line = strings.TrimSuffix(l, "\n")
				}
			}
			quota := strings.ReplaceAll(tc.quota, "<root>", root)
			if !strings.Contains(line, gomaxprocs+quota) || !strings.Contains(line, numcpu) ||
				!strings.Contains(line, "level=INFO") {
				t.Errorf("want an INFO line with %q, %q and %q:\n%s", gomaxprocs, quota, numcpu, out.String())
			}
			if got := strings.Contains(line, "gomaxprocs_from="); got != (tc.from != "") || !strings.Contains(line, tc.from) {
				t.Errorf("want gomaxprocs_from %q in the line:\n%s", tc.from, out.String())
			}
			debugged := strings.Contains(out.String(), `level=DEBUG msg="cpu: no cgroup CPU quota read"`)
			if debugged != (tc.debug != "") || !strings.Contains(out.String(), tc.debug) {
				t.Errorf("want the failure %q at debug (none if \"\"):\n%s", tc.debug, out.String())
			}
		})
	}
}

// gomaxprocs_from names a parent's quota only when following it would have
// given fewer than GOMAXPROCS (the runtime rounds up, to at least 2): a
// note where it changes nothing would read as GOMAXPROCS being off.
func TestGOMAXPROCSFromAParentsQuota(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	t.Setenv("GODEBUG", "")
	for _, tc := range []struct {
		cpus   float64
		parent bool
		procs  int
		want   string // "" for none
	}{
		{1.5, true, 8, "following it would give 2"},
		{0.5, true, 8, "following it would give 2"},
		{2.5, true, 4, "following it would give 3"},
		{2.5, true, 3, ""},
		{1.5, true, 2, ""},
		{1.5, false, 8, ""}, // the runtime's own: it follows it, or was set otherwise
		{0, false, 8, ""},
	} {
		got := gomaxprocsFrom(cpuQuota{cpus: tc.cpus, parent: tc.parent}, tc.procs)
		if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
			t.Errorf("a quota of %g (a parent's: %t) at GOMAXPROCS %d: %q, want %q", tc.cpus, tc.parent, tc.procs, got, tc.want)
		}
	}
}
