package processor

import (
	"testing"

	"github.com/jetsink/jetsink/tests/testenv"
)

// TestMain reports goroutines that outlive the tests (goleak) and stops
// the shared PostgreSQL cluster.
func TestMain(m *testing.M) { testenv.Main(m) }
