//go:build !linux

package testenv

import "os/exec"

// DieWithTest does nothing here: only Linux has a parent-death signal.
func DieWithTest(cmd *exec.Cmd) {}
