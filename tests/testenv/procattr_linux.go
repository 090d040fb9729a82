package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithTest has the kernel kill cmd, once started, when the test binary
// dies without stopping it (go test -timeout, a panic, SIGKILL): a child
// left running would hold its ports and memory, and a Jaeger that logs
// nothing would not even die writing to the closed pipe. The signal comes
// when the thread that started cmd ends, which the Go runtime does only to
// a thread a goroutine locked and did not unlock (Partition.Do when it
// cannot leave the namespace, pipeline's pin: cpu when it cannot restore
// the mask): do not start such a cmd from a goroutine that may do that.
func DieWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
