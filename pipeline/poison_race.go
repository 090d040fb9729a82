//go:build race

package pipeline

// poisonSlabs: see slab.release.
const poisonSlabs = true
