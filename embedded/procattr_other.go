//go:build !linux

package embedded

import "syscall"

// dieWithParent does nothing where there is no parent death signal: the
// server outlives a killed process until the next StartPostgres sweeps it.
func dieWithParent(*syscall.SysProcAttr, syscall.Signal) {}
