package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetsink/jetsink/config"
	"github.com/jetsink/jetsink/tests/testenv"
)

// noSpace is stdout on a full disk (> /dev/full): every write fails.
type noSpace struct{ writes int }

func (w *noSpace) Write([]byte) (int, error) {
	w.writes++
	return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}
}

// Output that could not be written (keys or init --print > FILE on a full
// disk, --version > /dev/full) fails the command with exitFailed, not
// exitConfig, saying so once; a command's own failure stays beside it.
func TestOutputWriteFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t.Setenv("JETSINK_CONFIG", "")
	pg := testenv.Postgres(t)
	for _, tc := range []struct {
		args []string
		also error // the command's own error, kept
	}{
		{[]string{"keys"}, nil},
		{[]string{"--version"}, nil},
		{[]string{"--help"}, nil},
		{[]string{"help", "run"}, nil},
		{[]string{"init", "--print", "--database-url", pg.URL, "--table", "outfail"}, nil},
		{[]string{"check", "--nats-url", "nats://127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x"}, errCheckFailed},
	} {
		root := newRoot()
		w := &noSpace{}
		var errOut strings.Builder
		root.SetOut(w)
		root.SetErr(&errOut)
		root.SetArgs(tc.args)
		err := execute(ctx, root)
		if code := exitCode(err); code != exitFailed || !errors.Is(err, syscall.ENOSPC) ||
			!strings.Contains(fmt.Sprint(err), "could not write the output") || tc.also != nil && !errors.Is(err, tc.also) {
			t.Errorf("jetsink %s: exit %d, %v; want %d, saying the output could not be written (ENOSPC)%s",
				strings.Join(tc.args, " "), code, err, exitFailed, map[bool]string{true: ", beside " + fmt.Sprint(tc.also)}[tc.also != nil])
		}
		if w.writes == 0 {
			t.Errorf("jetsink %s: nothing written", strings.Join(tc.args, " "))
		}
		if strings.Contains(errOut.String(), "no space left") || strings.Count(fmt.Sprint(err), "no space left") != 1 {
			t.Errorf("jetsink %s: the failure not said once: %v; stderr:\n%s", strings.Join(tc.args, " "), err, errOut.String())
		}
	}
}

// readerGone is a stdout whose reader has gone (`jetsink keys | head -1`).
type readerGone struct{}

func (readerGone) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
}

// Output whose reader has gone (EPIPE) ends the command with exitFailed
// and nothing on stderr, as SIGPIPE would have: jetsink catches SIGPIPE
// (survivePipes), and `jetsink keys | head -1` is no failure to report.
func TestOutputReaderGoneIsQuiet(t *testing.T) {
	t.Setenv("JETSINK_CONFIG", "")
	root := newRoot()
	root.SetOut(readerGone{})
	var errOut strings.Builder
	root.SetErr(&errOut)
	root.SetArgs([]string{"keys"})
	err := execute(context.Background(), root)
	if !errors.Is(err, syscall.EPIPE) || !isOutputClosed(err) {
		t.Fatalf("jetsink keys into a closed pipe: %v; want the broken pipe, as outputClosed", err)
	}
	r, w, perr := os.Pipe()
	if perr != nil {
		t.Fatal(perr)
	}
	stderr := os.Stderr
	os.Stderr = w
	code := exitCode(err)
	os.Stderr = stderr
	w.Close()
	said, _ := io.ReadAll(r)
	r.Close()
	if code != exitFailed || len(said) > 0 || errOut.Len() > 0 {
		t.Fatalf("exit %d, stderr %q%q; want %d and nothing said", code, said, errOut.String(), exitFailed)
	}
}

// With JSON logs, check's exit is one JSON record even when stdout failed
// as well (execute joins the two errors), and init's and check's logs are
// JSON throughout. Before, a failed stdout turned the exit back into lines
// of text.
func TestJSONExitBesideAFailedOutput(t *testing.T) {
	t.Setenv("JETSINK_CONFIG", "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := newRoot()
	var errOut strings.Builder
	root.SetOut(&noSpace{})
	root.SetErr(&errOut)
	root.SetArgs([]string{"check", "--nats-url", "nats://127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x", "--set", "log.format=json"})
	code := exitCode(execute(ctx, root))
	var exits []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("a line that is not JSON: %q", l)
		}
		if rec["msg"] == "exiting" {
			exits = append(exits, rec)
		}
	}
	if code != exitFailed || len(exits) != 1 || exits[0]["exit_code"] != float64(exitFailed) ||
		!strings.Contains(fmt.Sprint(exits[0]["err"]), "could not write the output") || !strings.Contains(fmt.Sprint(exits[0]["err"]), "check found") {
		t.Fatalf("exit %d, records %v; want %d and one \"exiting\" record with both errors:\n%s", code, exits, exitFailed, errOut.String())
	}
}

// A configuration's several problems, found once the log exists, end in
// one JSON record that lists them, not one record each: one exit reads
// as one.
func TestJSONExitListsProblemsInOneRecord(t *testing.T) {
	var buf strings.Builder
	cfg := config.Default()
	cfg.Log.Format = "json"
	err := errors.Join(fmt.Errorf("%w: postgres.a is wrong", config.ErrInvalidConfig), fmt.Errorf("%w: postgres.b is wrong", config.ErrInvalidConfig))
	logExitAs(cfg, newLogger(cfg, &buf), &err)
	code := exitCode(err)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var rec struct {
		Msg      string
		Problems []string
		ExitCode int `json:"exit_code"`
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil || code != exitConfig || rec.Msg != "exiting" ||
		rec.ExitCode != exitConfig || len(rec.Problems) != 2 || !strings.Contains(rec.Problems[1], "postgres.b") {
		t.Fatalf("exit %d; want %d and one record listing both problems:\n%s", code, exitConfig, buf.String())
	}
}

// keys lists a key's shorter variable on a line of its own: the README and
// DESIGN.md name JETSINK_DATABASE_URL for postgres.url, and keys, which
// says it lists every key's variable, showed only JETSINK_POSTGRES_URL.
func TestKeysListsTheAliases(t *testing.T) {
	t.Setenv("JETSINK_CONFIG", "")
	root := newRoot()
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"keys"})
	if err := execute(context.Background(), root); err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^postgres\.url +string +JETSINK_DATABASE_URL +\(short for JETSINK_POSTGRES_URL\)$`)
	if !want.MatchString(out.String()) {
		t.Fatalf("jetsink keys lists no line for JETSINK_DATABASE_URL:\n%s", out.String())
	}
}
