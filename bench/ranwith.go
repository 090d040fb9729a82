package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// RanWith is what an engine ran with, as the engine itself logged it at its
// start (jetsink's "jetsink running" line, the baseline's "baseline
// running"): a figure cannot be reproduced without it. Report.CPUs is the
// bench's runtime.NumCPU, its CPU affinity mask, which a cgroup's CPU quota
// (docker run --cpus=2) does not narrow; the engine's GOMAXPROCS follows the
// quota (Go 1.25+), and pipeline.workers 0 follows the physical cores, so
// neither can be read off the machine. Nothing here is worked out by the
// bench: a field the engine did not log is 0 or "" and named in
// NotReported.
type RanWith struct {
	GOMAXPROCS int `json:"gomaxprocs,omitempty"`
	// CPUQuota is the cgroup CPU limit the engine saw, as it logged it
	// ("none" for none).
	CPUQuota    string `json:"cpu_quota,omitempty"`
	Workers     int    `json:"workers,omitempty"`              // pipeline.workers as resolved (a configured 0 logs the physical cores)
	Connections int    `json:"postgres_connections,omitempty"` // committers, each with its own connection
	Mode        string `json:"mode,omitempty"`                 // at-least-once or exactly-once
	// NotReported names (by their JSON keys) the fields the engine's
	// start-up line did not give; every one when the line was not found
	// (a log level above info hides it: --set log.level=warn).
	NotReported []string `json:"not_reported,omitempty"`
}

// The start-up lines the engines log at info, whose keys gomaxprocs,
// cpu_quota, workers, connections and mode ranWith reads: jetsink's
// (processor), the baseline's, and the "cpu" line that both commands log
// (cmd/jetsink: GOMAXPROCS and the cgroup CPU quota).
const (
	jetsinkStartMsg  = "jetsink running"
	baselineStartMsg = "baseline running"
	cpuStartMsg      = "cpu"
)

// ranWith reads what an engine ran with from its start-up lines in out, the
// head of its output (text or JSON slog format).
func ranWith(out string) RanWith {
	attrs := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		a := logAttrs(line)
		if m := a["msg"]; m == jetsinkStartMsg || m == baselineStartMsg || m == cpuStartMsg {
			for k, v := range a {
				if _, ok := attrs[k]; !ok { // the first line's value of a key both give
					attrs[k] = v
				}
			}
		}
	}
	var r RanWith
	// The log's keys, and the report's (JSON) names of the fields.
	atoi := func(key, name string) int {
		n, err := strconv.Atoi(attrs[key])
		if err != nil || n <= 0 {
			r.NotReported = append(r.NotReported, name)
			return 0
		}
		return n
	}
	str := func(key string) string {
		v := attrs[key]
		if v == "" {
			r.NotReported = append(r.NotReported, key)
		}
		return v
	}
	r.GOMAXPROCS = atoi("gomaxprocs", "gomaxprocs")
	r.CPUQuota = str("cpu_quota")
	r.Workers = atoi("workers", "workers")
	r.Connections = atoi("connections", "postgres_connections")
	r.Mode = str("mode")
	return r
}

// logAttrs is a slog record's attributes (msg among them) from one line of
// the text or the JSON handler's output; nil for a line that is neither.
func logAttrs(line string) map[string]string {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "{") {
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber() // 4, not 4e+00
		var m map[string]any
		if d.Decode(&m) != nil {
			return nil
		}
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[k] = fmt.Sprint(v)
		}
		return out
	}
	out := map[string]string{}
	for s := line; s != ""; s = strings.TrimLeft(s, " ") {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || k == "" || strings.ContainsAny(k, ` "`) {
			break // not key=value: not a slog text record from here on
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				break
			}
			v, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		out[k] = v
		s = rest
	}
	return out
}

// line is r for the text report.
func (r RanWith) line() string {
	var parts []string
	if r.GOMAXPROCS > 0 {
		parts = append(parts, fmt.Sprintf("GOMAXPROCS %d", r.GOMAXPROCS))
	}
	if r.CPUQuota != "" {
		parts = append(parts, "CPU quota "+r.CPUQuota)
	}
	if r.Workers > 0 {
		parts = append(parts, fmt.Sprintf("pipeline.workers %d", r.Workers))
	}
	if r.Connections > 0 {
		parts = append(parts, fmt.Sprintf("postgres.connections %d", r.Connections))
	}
	if r.Mode != "" {
		parts = append(parts, r.Mode)
	}
	s := "ran with (as it logged at its start): " + strings.Join(parts, ", ")
	if len(parts) == 0 {
		s = "ran with: its start-up line was not in its output (a log level above info hides it)"
	}
	if len(r.NotReported) > 0 && len(parts) > 0 {
		s += "; not logged: " + strings.Join(r.NotReported, ", ")
	}
	return s
}

// headMax is how much of the start of an engine's output its tailBuffer
// keeps beside the tail: the start-up lines, which a long run's warnings
// would push out of the tail.
const headMax = 32 << 10

// head returns the first headMax bytes written, cut after their last
// newline (a line cut short could be read as another value).
func (t *tailBuffer) head() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.first
	if i := bytes.LastIndexByte(h, '\n'); i >= 0 {
		h = h[:i+1]
	} else {
		h = nil
	}
	return string(h)
}
