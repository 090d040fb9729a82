package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithTest has the kernel kill cmd, once started, when the test binary
// dies without stopping it (go test -timeout, a panic, SIGKILL): a child
// left running would hold its ports and memory, and a Jaeger that logs
// nothing would not even die writing to the closed pipe. (The signal comes
// when the thread that started cmd ends; the Go runtime keeps its threads
// but for those a goroutine locked and left.)
func DieWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
