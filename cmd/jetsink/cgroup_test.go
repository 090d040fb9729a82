package main

import (
	"os"
	"path/filepath"
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
