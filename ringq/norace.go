//go:build !race

package ringq

const raceEnabled = false
