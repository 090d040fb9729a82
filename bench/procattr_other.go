//go:build unix && !linux

package bench

import "syscall"

// childAttr puts a child in a process group of its own (see startChild).
// Off Linux there is no parent-death signal: a bench killed outright
// (SIGKILL) leaves its children running until they are stopped by hand.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
