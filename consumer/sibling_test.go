package consumer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// addDurable makes durable name on cfg's stream as a jetsink writing to
// destination left it: explicit-ack pull, filter filter ("" for all),
// its ack floor at stream sequence start-1.
func addDurable(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, name, destination, filter string, start uint64) {
	t.Helper()
	if _, err := js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start, FilterSubject: filter,
		Metadata: map[string]string{destinationKey: destination}}); err != nil {
		t.Fatal(err)
	}
}

// ours is the destination the sibling tests' jetsink writes to.
const ours = "db1:5432/app public.events"

// siblingSetup starts a server and makes the stream of a jetsink writing
// to ours, holding 10 events on two subjects (in.<stream>.s0 and .s1);
// its context ends with the test, after 60 s at the most.
func siblingSetup(t *testing.T) (context.Context, *testenv.NATSServer, jetstream.JetStream, Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.Destination = ours
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, cfg, 10, 2, 0)
	return ctx, srv, js, cfg
}

// A renamed nats.consumer (durable A, used by a jetsink writing to this
// destination, left; B new) made B from the start of the stream, storing
// every event A's jetsink had stored again, at Info only, and check said
// only "does not exist yet". In at-least-once mode New now refuses it
// (ErrInvalidConfig) naming A, its ack floor and pending count, with the
// commands that make B from A's floor and remove A, and check reports it
// as an error; in exactly-once mode both warn. B is not made by the
// refusal. A durable of another destination is not ours: nothing said.
func TestNewDurableBesideAnotherOfTheDestination(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	a := cfg.Consumer + "_a"
	addDurable(t, ctx, js, cfg, a, ours, "", 7) // floor 6, 4 pending

	wants := []string{"durable consumer " + cfg.Consumer + " does not exist yet", a + " (ack floor at stream sequence 6, 4 events pending",
		"its 10 events"}
	fixWants := []string{"nats consumer add " + cfg.Stream + " " + cfg.Consumer + " --pull --ack explicit --deliver 7 --replay instant --defaults",
		"nats consumer rm " + cfg.Stream + " " + a + " --force",
		"nats consumer add " + cfg.Stream + " " + cfg.Consumer + " --pull --ack explicit --deliver all --replay instant --defaults"}
	has := func(what, got string, wants []string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(got, w) {
				t.Fatalf("%s lacks %q:\n%s", what, w, got)
			}
		}
	}

	// At-least-once: refused, B not made.
	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New beside %s: %v, want ErrInvalidConfig", a, err)
	}
	has("New's error", err.Error(), append(wants, append(fixWants, "each event is stored twice")...))
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("durable %s after the refusal: %v, want none", cfg.Consumer, err)
	}
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	p := siblingReported(ps, a)
	if p == nil || p.Warning || !p.Config {
		t.Fatalf("check reports %+v among %v; want an error naming %s", p, ps, a)
	}
	has("check's problem", p.String(), append(wants, fixWants...))

	// Exactly-once: a warning, and B is made.
	eo := cfg
	eo.StoredSeq = func(context.Context, string) (uint64, error) { return 0, nil }
	ps, err = Check(ctx, eo, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := siblingReported(ps, a); p == nil || !p.Warning || !strings.Contains(p.Message, "exactly-once skips those already stored") {
		t.Fatalf("exactly-once check reports %+v among %v; want a warning naming %s", p, ps, a)
	}
	_, log := newLoggedConsumer(t, ctx, eo)
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "does not exist yet") {
			line = l
		}
	}
	// B is made right after the Warn: its fix is for a durable made.
	has("exactly-once New's Warn line", line, append(wants, fixWants[0], fixWants[1],
		"stop this jetsink and those on "+a, "remove it (nats consumer rm "+cfg.Stream+" "+cfg.Consumer+" --force)"))
	if strings.Contains(line, "first start") {
		t.Fatalf("exactly-once New's Warn line speaks of %s's first start, made as it is logged:\n%s", cfg.Consumer, line)
	}

	// Another destination: not ours.
	other := cfg
	other.Consumer, other.Destination = cfg.Consumer+"_c", "db1:5432/app public.other"
	if got := checkText(t, ctx, other, false); strings.Contains(got, a) {
		t.Fatalf("check of another destination names %s:\n%s", a, got)
	}
	if _, log := newLoggedConsumer(t, ctx, other); strings.Contains(log.String(), a) {
		t.Fatalf("New of another destination names %s:\n%s", a, log.String())
	}
}

// Durables of one destination whose filters split the stream's subjects
// (one for in.<stream>.s0, one for .s1) deliver no event twice: a new
// one beside the other is no rename, and nothing is said.
func TestNewDurableOfAnotherFilterBesideOneOfTheDestination(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	s0 := cfg.Consumer + "_s0"
	addDurable(t, ctx, js, cfg, s0, ours, subjectOf(cfg, 0, 2), 1)
	cfg.FilterSubject = subjectOf(cfg, 1, 2)
	if got := checkText(t, ctx, cfg, false); strings.Contains(got, s0) {
		t.Fatalf("check of a disjoint filter names %s:\n%s", s0, got)
	}
	if _, log := newLoggedConsumer(t, ctx, cfg); strings.Contains(log.String(), s0) {
		t.Fatalf("New of a disjoint filter names %s:\n%s", s0, log.String())
	}
}

// siblingReported is the problem of ps naming durable name as one of this
// destination, nil for none.
func siblingReported(ps []Problem, name string) *Problem {
	for i, p := range ps {
		if strings.Contains(p.Message, "does not exist yet, and stream") && strings.Contains(p.Message, name) {
			return &ps[i]
		}
	}
	return nil
}

// A durable gone under a running jetsink, made again from the start of
// the stream (no ack floor known to start past) beside another of this
// destination, is warned of, not refused: refusing would stop a running
// pipeline, which New's refusal exists to keep from starting.
func TestDurableMadeAgainBesideAnotherOfTheDestinationWarns(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	c, log := newLoggedConsumer(t, ctx, cfg)
	a := cfg.Consumer + "_a"
	addDurable(t, ctx, js, cfg, a, ours, "", 7)
	if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatal(err)
	}
	if err := c.ensureConsumer(ctx, nil); err != nil {
		t.Fatalf("made again beside %s: %v, want a warning only", a, err)
	}
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatalf("durable %s not made again: %v", cfg.Consumer, err)
	}
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "does not exist yet, and stream") &&
			strings.Contains(l, a+" (ack floor at stream sequence 6, 4 events pending") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no Warn line naming %s with its floor and pending count; log:\n%s", a, log.String())
	}
	// Made again as it is logged: no "before its first start"; and the
	// consumer named once (the logger's), not twice.
	if strings.Contains(line, "first start") || !strings.Contains(line, "stop this jetsink") || strings.Count(line, " consumer=") != 1 {
		t.Fatalf("the Warn line speaks of the first start of a durable just made, or names the consumer other than once:\n%s", line)
	}
}

// The look at the stream's consumers stops at siblingLimit, says so, and
// leaves no goroutine behind (goleak, TestMain).
func TestSiblingsStopAtTheLimit(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	for i := range 5 {
		addDurable(t, ctx, js, cfg, cfg.Consumer+"_"+strconv.Itoa(i), ours, "", 1)
	}
	defer func(n int) { siblingLimit = n }(siblingLimit)
	siblingLimit = 2
	look, err := siblings(ctx, js, &cfg)
	if err != nil || !look.cut || len(look.found) != 2 {
		t.Fatalf("siblings: %d found, cut %v, err %v; want 2, cut, no error", len(look.found), look.cut, err)
	}
	p := siblingReported(mustCheck(t, ctx, cfg), cfg.Consumer+"_")
	if p == nil || !strings.Contains(p.Message, "2 durable consumers") || !strings.Contains(p.Message, "only the stream's first 2 consumers were looked at") {
		t.Fatalf("check reports %+v; want 2 durables, and the cut said", p)
	}
}

// mustCheck is Check's problems, failing t on its error.
func mustCheck(t *testing.T, ctx context.Context, cfg Config) []Problem {
	t.Helper()
	ps, err := Check(ctx, cfg, testLogger(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// A new durable whose filter is wider than the old one's: old durable A
// of in.<stream>.s0, its ack floor at stream sequence 8, and a new one
// without nats.filter_subject. A never delivered s1's events 2, 4, 6
// and 8, so the refusal's fix offered --deliver 9, which skips them for
// good. It now offers --deliver all and says why not past the floor. A
// new durable whose filter an old one's covers (the stream's own subject
// beside none) still gets --deliver <floor+1>.
func TestNewDurableWiderThanTheOldOneIsNotMadePastItsFloor(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	a := cfg.Consumer + "_a"
	addDurable(t, ctx, js, cfg, a, ours, subjectOf(cfg, 0, 2), 9) // floor 8

	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New beside %s: %v, want ErrInvalidConfig", a, err)
	}
	for _, got := range []string{err.Error(), siblingReported(mustCheck(t, ctx, cfg), a).String()} {
		if strings.Contains(got, "--deliver 9") {
			t.Fatalf("offers --deliver 9, which never delivers s1's events below it:\n%s", got)
		}
		for _, w := range []string{"--deliver all", "leave out", a + ": " + subjectOf(cfg, 0, 2), "1 event pending,"} {
			if !strings.Contains(got, w) {
				t.Fatalf("lacks %q:\n%s", w, got)
			}
		}
	}

	// Exactly-once: warned, made from the start, and the fix says that
	// is right. What the old durables' jetsinks stored is read again, not
	// stored again (duplicates skipped): check's fix and New's say so.
	eo := cfg
	eo.Consumer += "_eo"
	eo.StoredSeq = func(context.Context, string) (uint64, error) { return 0, nil }
	if got := siblingReported(mustCheck(t, ctx, eo), a).String(); !strings.Contains(got, "from the start of the stream, reading again what they stored (exactly-once skips") ||
		strings.Contains(got, "storing again") {
		t.Fatalf("exactly-once check's fix does not say the events are read again, or says stored again:\n%s", got)
	}
	_, log := newLoggedConsumer(t, ctx, eo)
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "does not exist yet, and stream") {
			line = l
		}
	}
	if !strings.Contains(line, "just made from the start of the stream, reads again what they stored (exactly-once skips") ||
		strings.Contains(line, "stores again") || strings.Contains(line, "--deliver 9") {
		t.Fatalf("exactly-once New's Warn line does not say %s, made from the start, is right, or offers --deliver 9:\n%s", eo.Consumer, line)
	}

	// Covered: B, of no filter, beside C of the stream's one subject.
	for _, n := range []string{a, eo.Consumer} {
		if err := js.DeleteConsumer(ctx, cfg.Stream, n); err != nil {
			t.Fatal(err)
		}
	}
	c := cfg.Consumer + "_c"
	addDurable(t, ctx, js, cfg, c, ours, cfg.Subjects[0], 9)
	_, err = New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--deliver 9 ") {
		t.Fatalf("New beside %s, whose filter covers every subject: %v; want ErrInvalidConfig offering --deliver 9", c, err)
	}
}

// A stream with subjects and sources holds sourced events on their own
// subjects, outside its subjects: stream S of in.<S>.> sourcing ORIG
// (x.<S>.>, 5 events, sequences 1-5 in S), 5 of its own after; old
// durable A of in.<S>.>, its ack floor at 10; a new durable of no
// filter. The refusal's fix offered --deliver 11, taking the new
// durable's subjects for S's own: the sourced events 1-5 would never be
// delivered. It now offers --deliver all.
func TestNewDurableOfAStreamWithSourcesIsNotMadePastTheFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := testenv.NATS(t)
	js := jsFor(t, srv)
	cfg := testConfig(t, srv)
	cfg.Destination, cfg.CreateStream = ours, false
	orig := cfg.Stream + "_orig"
	x := "x." + cfg.Stream
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: orig, Subjects: []string{x + ".>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := js.Publish(ctx, x+"."+strconv.Itoa(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Sources: []*jetstream.StreamSource{{Name: orig}}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		si, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Msgs == 5 {
			break
		}
		select { // the sourcing is the server's own: no event to wait on
		case <-ctx.Done():
			t.Fatalf("stream %s holds %d events, want the 5 sourced: %v", cfg.Stream, si.State.Msgs, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	publish(t, ctx, js, cfg, 5, 1, 0)
	a := cfg.Consumer + "_a"
	addDurable(t, ctx, js, cfg, a, ours, cfg.Subjects[0], 11) // floor 10

	_, err = New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New beside %s: %v, want ErrInvalidConfig", a, err)
	}
	for _, got := range []string{err.Error(), siblingReported(mustCheck(t, ctx, cfg), a).String()} {
		if strings.Contains(got, "--deliver 11") || !strings.Contains(got, "--deliver all") || !strings.Contains(got, "leave out") {
			t.Fatalf("offers --deliver 11, which never delivers the sourced events 1-5, or not --deliver all:\n%s", got)
		}
	}
}

func TestSubjectWithin(t *testing.T) {
	for _, tc := range []struct {
		narrow, wide string
		want         bool
	}{
		{"a.b", "a.b", true}, {"a.b", "a.*", true}, {"a.b", "a.>", true}, {"a.*", "a.>", true}, {"a.>", "a.>", true},
		{"a.b.c", "a.>", true}, {"a.*.c", "a.*.c", true}, {"a.b", ">", true}, {">", ">", true},
		{"a.>", "a.*", false}, {"a.*", "a.b", false}, {"a", "a.>", false}, {"a.b", "a", false}, {"a", "a.b", false},
		{">", "a.>", false}, {"a.b", "a.c", false}, {"a.b.c", "a.*", false}, {"*", "a", false},
	} {
		if got := subjectWithin(tc.narrow, tc.wide); got != tc.want {
			t.Errorf("subjectWithin(%q, %q) = %v, want %v", tc.narrow, tc.wide, got, tc.want)
		}
	}
}

// Without permission to publish to $JS.API.CONSUMER.LIST.<stream> the
// server refuses the look on the connection (an async -ERR), not to the
// request, which waited metaTimeout (10 s) at New, in check, and in a
// re-make during Run, and the warning said only "context deadline
// exceeded". The warning and check's problem now say there is no
// permission, and name it.
//
// The refusal ends the look, which waits siblingLookTimeout for an answer
// otherwise: here longer than the test's context, so that a look that
// waited for it would fail New.
func TestSiblingLookDeniedNamesThePermission(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer func(d time.Duration) { siblingLookTimeout = d }(siblingLookTimeout)
	siblingLookTimeout = time.Hour
	_, cfg, _ := permissionsServer(t, ctx, "$JS.API.CONSUMER.LIST.>")
	cfg.Destination = "db1:5432/app public.events"
	want := []string{"no permission", "may not publish to $JS.API.CONSUMER.LIST." + cfg.Stream}
	_, log := newLoggedConsumer(t, ctx, cfg)
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "could not look for other durable consumers") {
			line = l
		}
	}
	var p *Problem
	cfg.Consumer += "_new" // one that does not exist yet
	for _, q := range mustCheck(t, ctx, cfg) {
		if strings.Contains(q.Message, "could not look for other durable consumers") {
			p = &q
		}
	}
	if p == nil {
		t.Fatal("check reports no failed look")
	}
	for _, w := range append(want, "permission to publish to $JS.API.CONSUMER.LIST."+cfg.Stream) {
		if !strings.Contains(line, w) || !strings.Contains(p.String(), w) {
			t.Fatalf("lacks %q:\nNew's Warn line: %s\ncheck: %s", w, line, p)
		}
	}
}

// A look that timed out with no refusal on the connection says "no
// answer", not a permission.
func TestSiblingLookNoAnswer(t *testing.T) {
	srv := testenv.NATS(t)
	cfg := testConfig(t, srv)
	js := jsFor(t, srv)
	err := lookFailed(js.Conn(), &cfg, "list the consumers of stream "+cfg.Stream, "CONSUMER.LIST."+cfg.Stream, nil, context.DeadlineExceeded)
	if errors.Is(err, errLookDenied) || !strings.Contains(err.Error(), "no answer within") || strings.Contains(lookFix(&cfg, err), "permission") {
		t.Fatalf("lookFailed = %v (fix %q); want no answer, no permission named", err, lookFix(&cfg, err))
	}
}

// Past siblingLimit consumers with none of this destination among the
// first, an old durable after them was neither refused nor mentioned:
// New and check now warn that only the first were looked at.
func TestSiblingsCutWithNoneFoundWarns(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	for i := range 3 { // "_0" and "_1" list before "_2" (by name)
		dest := "db1:5432/app public.other"
		if i == 2 {
			dest = ours
		}
		addDurable(t, ctx, js, cfg, cfg.Consumer+"_"+strconv.Itoa(i), dest, "", 1)
	}
	defer func(n int) { siblingLimit = n }(siblingLimit)
	siblingLimit = 2
	look, err := siblings(ctx, js, &cfg)
	if err != nil || !look.cut || len(look.found) != 0 {
		t.Fatalf("siblings: %d found, cut %v, err %v; want none found, cut", len(look.found), look.cut, err)
	}
	const want = "only the first 2 consumers of stream"
	var p *Problem
	for _, q := range mustCheck(t, ctx, cfg) {
		if strings.Contains(q.Message, want) {
			p = &q
		}
	}
	if p == nil || !p.Warning {
		t.Fatalf("check reports %+v; want a warning saying %q", p, want)
	}
	if !strings.Contains(p.Fix, "before "+cfg.Consumer+"'s first start") {
		t.Fatalf("check's fix is not for a durable yet to be made:\n%s", p)
	}
	_, log := newLoggedConsumer(t, ctx, cfg)
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, want) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("New's log has no Warn line saying %q:\n%s", want, log.String())
	}
	// The durable is made right after the Warn: its fix is for one made
	// (it said "before <consumer>'s first start").
	if strings.Contains(line, "first start") || !strings.Contains(line, "stop this jetsink") ||
		!strings.Contains(line, "nats consumer rm "+cfg.Stream+" "+cfg.Consumer+" --force") {
		t.Fatalf("New's Warn line is not the fix for a durable made:\n%s", line)
	}
}

// noListAnswer has the sibling look's CONSUMER.LIST request go to a
// subject of the test's (siblingListSubject) that srv's handle answers,
// or leaves unanswered when handle is nil; and makes the look's timeout
// 1 s.
func noListAnswer(t *testing.T, srv *testenv.NATSServer, cfg Config, handle func(*nats.Msg)) {
	t.Helper()
	subject := "nolist." + cfg.Stream
	prev, prevTimeout := siblingListSubject, siblingLookTimeout
	t.Cleanup(func() { siblingListSubject, siblingLookTimeout = prev, prevTimeout })
	siblingListSubject = func(*Config) string { return subject }
	siblingLookTimeout = time.Second
	nc := srv.Connect(t)
	if handle == nil {
		handle = func(*nats.Msg) {}
	}
	if _, err := nc.Subscribe(subject, handle); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// lookRefusedAtNew asserts that New, in at-least-once mode, refuses to
// make the durable with an error that is not ErrInvalidConfig (retried
// by a restart) and has wants, and makes none; that check warns with
// wants; and that exactly-once New warns with wants and makes it.
func lookRefusedAtNew(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg Config, wants ...string) {
	t.Helper()
	_, err := New(ctx, cfg, testLogger(t, nil))
	if err == nil || errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New: %v; want an error, not ErrInvalidConfig", err)
	}
	for _, w := range append(wants, "not making durable consumer "+cfg.Consumer+" from the start of the stream") {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("New's error lacks %q:\n%v", w, err)
		}
	}
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("durable %s after the refusal: %v, want none", cfg.Consumer, err)
	}
	var p *Problem
	for _, q := range mustCheck(t, ctx, cfg) {
		if strings.Contains(q.Message, "could not look for other durable consumers") {
			p = &q
		}
	}
	if p == nil || !p.Warning || !strings.Contains(p.Message, "does not create it but exits non-zero") {
		t.Fatalf("check reports %+v; want a warning of the look, saying run does not create the durable", p)
	}
	eo := cfg
	eo.StoredSeq = func(context.Context, string) (uint64, error) { return 0, nil }
	_, log := newLoggedConsumer(t, ctx, eo)
	for _, w := range wants {
		if !strings.Contains(p.Message, w) || !strings.Contains(log.String(), w) {
			t.Fatalf("lacks %q:\ncheck: %s\nexactly-once New's log:\n%s", w, p, log)
		}
	}
}

// A look at the stream's consumers that got no answer (3 s, shorter than
// the 4 s a clustered server waits for each consumer's leader) was a
// warning, and New went on to make the durable from the start of the
// stream: an old durable of this destination not seen, its events stored
// again. At New in at-least-once mode it now refuses, with an error that
// is not the configuration's (run exits non-zero, and is started again);
// check and exactly-once warn.
func TestSiblingLookNoAnswerRefusesAtNew(t *testing.T) {
	ctx, srv, js, cfg := siblingSetup(t)
	noListAnswer(t, srv, cfg, nil)
	lookRefusedAtNew(t, ctx, js, cfg, "no answer within 1s")
}

// nats.go's lister dropped the server's missing list (the consumers whose
// leader did not answer the server within its 4 s): an old durable of
// this destination among them was taken for none. A look with consumers
// missing, none of this destination among the others, now refuses at
// New in at-least-once mode, naming them, as for no answer.
func TestSiblingLookWithConsumersMissingRefusesAtNew(t *testing.T) {
	ctx, srv, js, cfg := siblingSetup(t)
	noListAnswer(t, srv, cfg, func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.consumer_list_response","total":1,"offset":0,"limit":256,"consumers":[],"missing":["old_one"]}`))
	})
	lookRefusedAtNew(t, ctx, js, cfg, "1 consumer old_one did not answer", "may be a durable of this destination")
}

// The server pages the stream's consumers 256 at a time: a durable of
// this destination on the second page is found.
func TestSiblingsReadEveryPage(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	for i := range 257 { // sorted by name: "_o..." before "_zz"
		addDurable(t, ctx, js, cfg, cfg.Consumer+"_o"+strconv.Itoa(1000+i), "db1:5432/app public.other", "", 1)
	}
	last := cfg.Consumer + "_zz"
	addDurable(t, ctx, js, cfg, last, ours, "", 1)
	look, err := siblings(ctx, js, &cfg)
	if err != nil || look.cut || len(look.found) != 1 || look.found[0].Name != last {
		t.Fatalf("siblings: found %d, cut %v, err %v; want %s alone", len(look.found), look.cut, err, last)
	}
}

// On a cluster the server gathers the consumers' infos from their
// leaders before it answers the look (its missing list): an old durable
// of this destination on a stream of three replicas is found, and New
// refuses.
func TestNewDurableBesideAnotherOfTheDestinationOnACluster(t *testing.T) {
	js, cfg := onCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg.Destination, cfg.StreamReplicas = ours, 3
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.Subjects, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	a := cfg.Consumer + "_a"
	addDurable(t, ctx, js, cfg, cfg.Consumer+"_0", "db1:5432/app public.other", "", 1)
	addDurable(t, ctx, js, cfg, a, ours, "", 1)
	_, err := New(ctx, cfg, testLogger(t, nil))
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), a+" (ack floor at stream sequence 0") {
		t.Fatalf("New beside %s on a cluster: %v; want ErrInvalidConfig naming it", a, err)
	}
}

// A consumer whose servers are all offline is listed by nats-server with
// its configuration alone, no name, and named in missing too: it was
// taken for a consumer that did not answer, and a fresh durable refused
// at New for as long as its node was down, though its metadata had been
// read (diff review of cf6f3cd). One of another destination lets New make
// the durable; one of this destination is named in the refusal.
func TestSiblingLookReadsAnOfflineConsumersConfig(t *testing.T) {
	for _, tc := range []struct {
		dest string
		made bool
	}{{"db1:5432/app public.other", true}, {ours, false}} {
		t.Run(strconv.FormatBool(tc.made), func(t *testing.T) {
			ctx, srv, js, cfg := siblingSetup(t)
			noListAnswer(t, srv, cfg, func(m *nats.Msg) {
				_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.consumer_list_response","total":1,"offset":0,"limit":256,` +
					`"consumers":[{"config":{"durable_name":"down_one","name":"down_one","ack_policy":"explicit","metadata":{"` +
					destinationKey + `":"` + tc.dest + `"}}}],"missing":["down_one"]}`))
			})
			c, err := New(ctx, cfg, testLogger(t, nil))
			if c != nil {
				t.Cleanup(func() { _ = c.Close(context.Background()) })
			}
			if tc.made {
				if err != nil {
					t.Fatalf("New beside an offline consumer of another destination: %v; want the durable made", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "down_one") || strings.Contains(err.Error(), "did not answer") {
				t.Fatalf("New beside an offline consumer of this destination: %v; want ErrInvalidConfig naming down_one, not as unanswered", err)
			}
			if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Fatalf("durable %s after the refusal: %v, want none", cfg.Consumer, err)
			}
		})
	}
}

// An account that imports JetStream's API without CONSUMER.LIST gets no
// responders for the look, at once: that lasts as long as the account's
// setup, as a permission refusal does, so it is a warning naming the
// subject to import, not a refusal to start at every restart (diff
// review of cf6f3cd).
func TestSiblingLookWithoutARouteWarns(t *testing.T) {
	ctx, _, js, cfg := siblingSetup(t)
	prev := siblingListSubject
	t.Cleanup(func() { siblingListSubject = prev })
	siblingListSubject = func(*Config) string { return "nobody.listens." + cfg.Stream }
	_, log := newLoggedConsumer(t, ctx, cfg)
	if _, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer); err != nil {
		t.Fatalf("durable %s: %v, want it made", cfg.Consumer, err)
	}
	if !strings.Contains(log.String(), "nothing answers") || !strings.Contains(log.String(), "import (or export)") {
		t.Fatalf("New's log does not say the account has no route to the list, and what to import:\n%s", log)
	}
}
