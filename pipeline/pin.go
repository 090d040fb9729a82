package pipeline

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// pin ties the calling worker goroutine to the machine as p.cfg.Pin says
// and returns the function that undoes it.
func (p *Pipeline) pin(id int) (unpin func(), err error) {
	switch p.cfg.Pin {
	case PinThread:
		runtime.LockOSThread()
		return runtime.UnlockOSThread, nil
	case PinCPU:
		return pinToCPU(id, p.cpus[id%len(p.cpus)])
	default:
		return func() {}, nil
	}
}

// PhysicalCores returns the number of physical cores this process may run
// on: distinct (physical_package_id, core_id) pairs over the CPUs of its
// affinity mask, read from /sys/devices/system/cpu/cpu*/topology. It falls
// back to runtime.GOMAXPROCS(0) when the topology is unreadable and never
// returns more than GOMAXPROCS or less than 1.
func PhysicalCores() int {
	procs := runtime.GOMAXPROCS(0)
	n, err := physicalCores("/sys/devices/system/cpu")
	if err != nil || n < 1 {
		return procs
	}
	return min(n, procs)
}

func physicalCores(sysCPU string) (int, error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return 0, err
	}
	type core struct{ pkg, id int }
	seen := make(map[core]struct{}, len(cpus))
	for _, c := range cpus {
		dir := sysCPU + "/cpu" + strconv.Itoa(c) + "/topology/"
		pkg, err := readInt(dir + "physical_package_id")
		if err != nil {
			return 0, err
		}
		id, err := readInt(dir + "core_id")
		if err != nil {
			return 0, err
		}
		seen[core{pkg, id}] = struct{}{}
	}
	return len(seen), nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
