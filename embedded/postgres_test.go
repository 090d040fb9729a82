package embedded

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A cluster whose owner died is stopped and removed by the next start; one
// whose owner lives is left alone.
func TestSweepOrphans(t *testing.T) {
	orphan, err := StartPostgres()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = orphan.Destroy() })
	alive, err := StartPostgres()
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = alive.Destroy() })

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan.dir, ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	sweepOrphans()

	if _, err := os.Stat(orphan.dir); !os.IsNotExist(err) {
		t.Fatalf("orphan's directory still there: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(orphan.Port()), time.Second); err == nil {
		conn.Close()
		t.Fatal("orphan's server still accepts connections")
	}
	if _, err := os.Stat(alive.dir); err != nil {
		t.Fatalf("a live owner's cluster was swept: %v", err)
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(alive.Port()), time.Second)
	if err != nil {
		t.Fatalf("a live owner's server was stopped: %v", err)
	}
	conn.Close()
}
