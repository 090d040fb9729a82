package embedded

import "syscall"

// dieWithParent has the kernel send sig to the process a once started
// when the thread that started it ends (see startPostmaster).
func dieWithParent(a *syscall.SysProcAttr, sig syscall.Signal) { a.Pdeathsig = sig }
