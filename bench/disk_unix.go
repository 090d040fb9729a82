//go:build linux || darwin || freebsd || dragonfly

package bench

import "syscall"

// The systems whose syscall.Statfs_t has Bavail and Bsize (OpenBSD's,
// NetBSD's and Solaris's do not: disk_other.go).

// freeBytes is the space on dir's file system that an unprivileged process
// may still fill (statfs's f_bavail blocks), and whether it could be read.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
