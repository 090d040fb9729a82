package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// strictKeys is a slog.Handler for tests that reports, through report, a
// record that carries one key twice at the same level of its JSON object:
// from the logger's With (the consumer's carries component, stream and
// consumer), its groups, and the record's own attrs. A log shipper that
// indexes JSON lines (Elasticsearch, OpenSearch) refuses such a line
// whole, and slog's handlers write both. The report names the key, the
// message and the line of the log call, so that a repeat added anywhere
// in the package fails the test that logged it.
type strictKeys struct {
	inner  slog.Handler
	report func(string)
	prefix string          // the open groups, each followed by "."
	keys   map[string]bool // the keys With and WithGroup set, under their groups' prefixes
}

func newStrictKeys(inner slog.Handler, report func(string)) *strictKeys {
	return &strictKeys{inner: inner, report: report, keys: map[string]bool{}}
}

func (h *strictKeys) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *strictKeys) Handle(ctx context.Context, r slog.Record) error {
	seen := make(map[string]bool, len(h.keys)+r.NumAttrs())
	for k := range h.keys {
		seen[k] = true
	}
	var dups []string
	r.Attrs(func(a slog.Attr) bool {
		dups = addKeys(seen, h.prefix, a, dups)
		return true
	})
	if len(dups) > 0 {
		h.report(fmt.Sprintf("log line %q from %s carries key(s) %s twice (Elasticsearch and OpenSearch refuse such a JSON line)",
			r.Message, callSite(r.PC), strings.Join(dups, ", ")))
	}
	return h.inner.Handle(ctx, r)
}

func (h *strictKeys) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := h.clone()
	c.inner = h.inner.WithAttrs(attrs)
	var dups []string
	for _, a := range attrs {
		dups = addKeys(c.keys, c.prefix, a, dups)
	}
	if len(dups) > 0 {
		h.report(fmt.Sprintf("logger.With(...) from %s carries key(s) %s twice", callSite(0), strings.Join(dups, ", ")))
	}
	return c
}

func (h *strictKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := h.clone()
	c.inner = h.inner.WithGroup(name)
	// The group is itself a key at its level.
	if c.keys[c.prefix+name] {
		h.report(fmt.Sprintf("logger.WithGroup(%q) from %s opens a group under a key already set", name, callSite(0)))
	}
	c.keys[c.prefix+name] = true
	c.prefix += name + "."
	return c
}

func (h *strictKeys) clone() *strictKeys {
	c := *h
	c.keys = make(map[string]bool, len(h.keys))
	for k := range h.keys {
		c.keys[k] = true
	}
	return &c
}

// addKeys records a's key (a group's: each of its members, under its
// name; an unnamed group's inline) under prefix in seen, and appends to
// dups each one seen before. It leaves out what slog's handlers leave
// out: an empty Attr, and a group with no members.
func addKeys(seen map[string]bool, prefix string, a slog.Attr, dups []string) []string {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		members := v.Group()
		if len(members) == 0 {
			return dups
		}
		p := prefix
		if a.Key != "" {
			if seen[prefix+a.Key] {
				dups = append(dups, prefix+a.Key)
			}
			seen[prefix+a.Key] = true
			p = prefix + a.Key + "."
		}
		for _, m := range members {
			dups = addKeys(seen, p, m, dups)
		}
		return dups
	}
	if a.Equal(slog.Attr{}) {
		return dups
	}
	if seen[prefix+a.Key] {
		dups = append(dups, prefix+a.Key)
	}
	seen[prefix+a.Key] = true
	return dups
}

// callSite is where a log call at pc is, file:line; with pc 0, the first
// caller outside log/slog and this file (a logger.With).
func callSite(pc uintptr) string {
	if pc != 0 {
		f, _ := runtime.CallersFrames([]uintptr{pc}).Next()
		return fmt.Sprintf("%s:%d", f.File, f.Line)
	}
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "log/slog.") && !strings.Contains(f.Function, "strictKeys") {
			return fmt.Sprintf("%s:%d", f.File, f.Line)
		}
		if !more {
			return "an unknown caller"
		}
	}
}

// The strict handler sees a key repeated across With, groups and the
// record, and only at one level, as slog's JSON output has it.
func TestStrictKeysFindsRepeatedKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		want string // "": no report
	}{
		{"distinct", func(l *slog.Logger) { l.With("a", 1).Info("m", "b", 2) }, ""},
		{"with and record", func(l *slog.Logger) { l.With("a", 1).Info("m", "a", 2) }, "a"},
		{"record twice", func(l *slog.Logger) { l.Info("m", "a", 1, "a", 2) }, "a"},
		{"two withs", func(l *slog.Logger) { l.With("a", 1).With("a", 2).Info("m") }, "a"},
		{"other group", func(l *slog.Logger) { l.With("a", 1).WithGroup("g").Info("m", "a", 2) }, ""},
		{"in a group", func(l *slog.Logger) { l.WithGroup("g").With("a", 1).Info("m", "a", 2) }, "g.a"},
		{"group attr", func(l *slog.Logger) { l.With("g", 1).Info("m", slog.Group("g", "a", 2)) }, "g"},
		{"inline group", func(l *slog.Logger) { l.With("a", 1).Info("m", slog.Group("", "a", 2)) }, "a"},
		{"empty group", func(l *slog.Logger) { l.With("g", 1).Info("m", slog.Group("g")) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reports []string
			var out strings.Builder
			tc.log(slog.New(newStrictKeys(slog.NewJSONHandler(&out, nil), func(s string) { reports = append(reports, s) })))
			// slog's JSON agrees, at the top level (duplicateKey).
			dup, err := duplicateKey(out.String())
			if err != nil {
				t.Fatal(err)
			}
			if top := tc.want; !strings.Contains(top, ".") && dup != top {
				t.Errorf("slog's JSON has %q twice at the top level, want %q: %s", dup, top, out.String())
			}
			if tc.want == "" {
				if len(reports) > 0 {
					t.Errorf("reported %q, want nothing: %s", reports, out.String())
				}
				return
			}
			if len(reports) != 1 || !strings.Contains(reports[0], tc.want) || !strings.Contains(reports[0], "logkeys_test.go:") {
				t.Errorf("reported %q, want one naming %s and this file's line", reports, tc.want)
			}
		})
	}
}

// strictReport is a strictKeys report that fails t with each distinct
// report at its end (in t.Cleanup, after the cleanups registered later,
// such as a consumer's Close, have logged): a consumer's goroutines log
// from outside the test's, where a report must not end the test, and
// the same line repeated is reported once.
func strictReport(t testing.TB) func(string) {
	var mu sync.Mutex
	var reports []string
	seen := map[string]bool{}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range reports {
			t.Error(r)
		}
	})
	return func(r string) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[r] {
			seen[r] = true
			reports = append(reports, r)
		}
	}
}
