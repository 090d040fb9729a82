//go:build race

package ringq

// raceEnabled turns on SPSC misuse detection in race-detector builds.
const raceEnabled = true
