package pipeline

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// pinToCPU locks the calling goroutine (worker id) to its thread and binds
// the thread to cpu; the function it returns gives the thread its old
// mask back and unlocks it.
func pinToCPU(id, cpu int) (unpin func(), err error) {
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pipeline worker %d: read CPU affinity: %w", id, err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pipeline worker %d: bind to CPU %d: %w", id, cpu, err)
	}
	return func() {
		// Give the thread back with its old mask; if that fails, stay
		// locked so the runtime ends the thread with the goroutine.
		if unix.SchedSetaffinity(0, &old) == nil {
			runtime.UnlockOSThread()
		}
	}, nil
}

// allowedCPUs lists the CPUs in this process's affinity mask.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("empty CPU affinity mask")
	}
	return cpus, nil
}
