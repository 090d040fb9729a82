package wire

import (
	"testing"

	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
