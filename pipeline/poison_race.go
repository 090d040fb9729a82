//go:build race

package pipeline

import (
	"sync"
	"unsafe"
)

// poisonSlabs: see slab.release.
const poisonSlabs = true

// releaseLog records the tuples of a slab's present generation that have
// been released, so that a second release of any of them panics, also
// while other rows of the slab are held (the slab's count alone catches
// it only when the row was the slab's last). Race-detector builds only:
// it costs a map entry per row.
type releaseLog struct {
	mu   sync.Mutex
	seen map[*byte]struct{}
}

// reset starts the log of a new generation.
func (l *releaseLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.seen)
}

// once panics if tuple was released before in this generation.
func (l *releaseLog) once(tuple []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := unsafe.SliceData(tuple)
	if _, ok := l.seen[p]; ok {
		panic("pipeline: a row released twice")
	}
	if l.seen == nil {
		l.seen = make(map[*byte]struct{})
	}
	l.seen[p] = struct{}{}
}
