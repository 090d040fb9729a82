package bench

import "syscall"

// childAttr puts a child in a process group of its own and has the kernel
// send it SIGTERM should the bench die (see startChild).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
