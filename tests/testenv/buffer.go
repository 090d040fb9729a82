package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that may be read while others write to it:
// a logger's or a subprocess's output that a test polls.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
