package consumer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/pipeline"
)

// siblingLimit bounds how many of the event stream's consumers siblings
// reads (the server pages them 256 at a time): a stream may have many,
// and the look is made before each new durable, inside New's time. A
// variable for the tests.
var siblingLimit = 4096

// siblings lists the durables on the event stream other than
// nats.consumer that a jetsink writing to cfg.Destination last used (its
// metadata key destinationKey names it, compared as destinationProblem
// does) and whose filter overlaps nats.filter_subject: events that
// jetsink stored, a new durable named nats.consumer delivers again from
// the start of the stream (a renamed nats.consumer; two instances of a
// rolling update configured with two names). Those with disjoint filters split the stream's subjects
// between them, as they should. A durable whose metadata has a key of
// jetsink's but not destinationKey was left by a jetsink from before that
// key (madeByJetsink): it may be of this destination (upgraded, then
// renamed), and is found too, named in look.unrecorded; one without any
// key of jetsink's is no jetsink's. Nothing when cfg.Destination is "". The
// look takes siblingLookTimeout at most, less when the server refuses it
// (watchDenial); its error says when the server refused it (lookFailed,
// errLookDenied), and when consumers it could not look at may be of this
// destination (errLookIncomplete).
func siblings(ctx context.Context, js jetstream.JetStream, cfg *Config) (look siblingLook, err error) {
	if cfg.Destination == "" {
		return look, nil
	}
	nc := js.Conn()
	before := nc.LastError()
	ctx, cancel := context.WithTimeout(ctx, siblingLookTimeout)
	defer cancel()
	defer watchDenial(ctx, cancel, nc, cfg, before)()
	stream, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return look, lookFailed(nc, cfg, "look up stream "+cfg.Stream, "STREAM.INFO."+cfg.Stream, before, err)
	}
	what := "list the consumers of stream " + cfg.Stream
	seen := map[string]bool{}
	var unanswered []string
	for offset := 0; !look.cut; {
		page, err := consumerPage(ctx, nc, cfg, offset)
		if err != nil {
			return siblingLook{}, lookFailed(nc, cfg, what, "CONSUMER.LIST."+cfg.Stream, before, err)
		}
		for _, info := range page.Consumers {
			// A consumer whose servers are all offline is listed by its
			// configuration alone, without its name (and named in
			// missing too); one created or deleted between pages can be
			// listed twice.
			info.Name = cmp.Or(info.Name, info.Config.Name, info.Config.Durable)
			if seen[info.Name] {
				continue
			}
			if len(seen) == siblingLimit {
				look.cut = true
				break
			}
			seen[info.Name] = true
			cc := &info.Config
			if info.Name == cfg.Consumer || !filtersOverlap(cc, cfg.FilterSubject) {
				continue
			}
			switch recorded, ok := cc.Metadata[destinationKey]; {
			case ok && recorded == cfg.Destination:
			case !ok && madeByJetsink(cc):
				// Made or last used by a jetsink from before
				// destinationKey: it may have written here.
				look.unrecorded = append(look.unrecorded, info.Name)
			default:
				continue
			}
			look.found = append(look.found, info)
		}
		unanswered = append(unanswered, page.Missing...)
		for n := range page.Offline {
			unanswered = append(unanswered, n)
		}
		// The server pages the stream's consumers by offset, those that
		// did not answer among them.
		next := page.Offset + max(page.Limit, len(page.Consumers))
		if next <= offset || next >= page.Total {
			break
		}
		offset = next
	}
	for _, n := range unanswered {
		// An offline consumer is listed with its configuration too: its
		// metadata was looked at.
		if !seen[n] && n != cfg.Consumer && !slices.Contains(look.unanswered, n) {
			look.unanswered = append(look.unanswered, n)
		}
	}
	if len(look.unanswered) > 0 && len(look.found) == 0 {
		return siblingLook{}, fmt.Errorf("%s: %w: %s did not answer the server within its time (nats-server waits 4s for each consumer's leader); "+
			"any of them may be a durable of this destination", what, errLookIncomplete, unansweredWords(look.unanswered))
	}
	si := stream.CachedInfo()
	look.held, look.subjects = si.State.Msgs, si.Config.Subjects
	look.sourced = len(si.Config.Sources) > 0 || si.Config.Mirror != nil
	return look, nil
}

// madeByJetsink reports whether a jetsink made or used the durable of cc:
// its metadata has a key of jetsink's (jetsinkKeyPrefix). Jetsinks from
// before destinationKey (2026-12-07) recorded filterKey, or
// strandedKey, but not where they wrote.
func madeByJetsink(cc *jetstream.ConsumerConfig) bool {
	for k := range cc.Metadata {
		if strings.HasPrefix(k, jetsinkKeyPrefix) {
			return true
		}
	}
	return false
}

// jetsinkKeyPrefix begins each key jetsink writes in a consumer's
// metadata (filterKey, destinationKey, ...).
const jetsinkKeyPrefix = "jetsink_"

// siblingListSubject is the subject of the request that lists cfg's
// stream's consumers. A variable for the tests, which answer it
// themselves.
var siblingListSubject = func(cfg *Config) string { return cfg.APIPrefix() + ".CONSUMER.LIST." + cfg.Stream }

// consumerListPage is a page of the server's answer to CONSUMER.LIST
// (nats-server's JSApiConsumerListResponse). Read here, not through
// nats.go's lister, which drops missing and offline: consumers whose
// leader did not answer the server in time, or is offline, which may be
// of this destination, and would be taken for none.
type consumerListPage struct {
	Total     int                       `json:"total"`
	Offset    int                       `json:"offset"`
	Limit     int                       `json:"limit"`
	Consumers []*jetstream.ConsumerInfo `json:"consumers"`
	Missing   []string                  `json:"missing"`
	Offline   map[string]string         `json:"offline"`
	Error     *jetstream.APIError       `json:"error"`
}

// consumerPage asks for the page of cfg's stream's consumers from offset.
func consumerPage(ctx context.Context, nc *nats.Conn, cfg *Config, offset int) (*consumerListPage, error) {
	req, err := json.Marshal(struct {
		Offset int `json:"offset"`
	}{offset})
	if err != nil {
		return nil, err
	}
	msg, err := nc.RequestWithContext(ctx, siblingListSubject(cfg), req)
	if err != nil {
		return nil, err
	}
	var page consumerListPage
	if err := json.Unmarshal(msg.Data, &page); err != nil {
		return nil, fmt.Errorf("the server's answer is no consumer list: %w", err)
	}
	if page.Error != nil {
		return nil, page.Error
	}
	return &page, nil
}

// unansweredWords names the consumers a look could not read.
func unansweredWords(names []string) string {
	const most = 10
	if len(names) > most {
		return fmt.Sprintf("%s (and %d more)", plural(len(names), "consumer", "consumers")+" "+strings.Join(names[:most], ", "), len(names)-most)
	}
	return plural(len(names), "consumer", "consumers") + " " + strings.Join(names, ", ")
}

// siblingLookTimeout bounds siblings' look: made before a new durable
// (at New, in check, and when Run makes it again, holding metaMu). It is
// longer than the 4 s a clustered nats-server waits for each consumer's
// leader before it answers CONSUMER.LIST (naming those that did not
// answer): a shorter look would take a cluster that still answers for
// one that does not, and at New refuse to start. A refusal of the
// user's publish ends it sooner (watchDenial). A variable for the tests.
var siblingLookTimeout = metaTimeout

// denialPoll is how often watchDenial reads the connection's last error.
const denialPoll = 100 * time.Millisecond

// errLookDenied marks lookFailed's error for a request the server
// refused to let the user publish, errLookUnrouted one that nothing
// answers at once (no responders: an account that imports JetStream's
// API without that subject). Either lasts as long as the account's
// setup (lookBarred): a warning, not a refusal to start.
var (
	errLookDenied   = errors.New("no permission")
	errLookUnrouted = errors.New("no route")
)

// lookBarred reports whether the look failed for the account's setup
// (errLookDenied, errLookUnrouted), not for want of an answer.
func lookBarred(err error) bool {
	return errors.Is(err, errLookDenied) || errors.Is(err, errLookUnrouted)
}

// errLookIncomplete marks siblings' error when the server named
// consumers that did not answer it, and none of this destination was
// among those that did.
var errLookIncomplete = errors.New("not every consumer answered")

// watchDenial ends the look (cancel) as soon as the connection's last
// error, other than before, is the server refusing the user a publish to
// one of the look's API subjects (lookDenial): the server refuses on the
// connection (an async -ERR, within a round trip), not to the request,
// which would wait out siblingLookTimeout. The function it returns stops
// the watch and waits for it to end.
func watchDenial(ctx context.Context, cancel context.CancelFunc, nc *nats.Conn, cfg *Config, before error) (stop func()) {
	return pollDenial(ctx, cancel, func() bool {
		return lookDenial(nc, cfg, before, "STREAM.INFO."+cfg.Stream) != nil || lookDenial(nc, cfg, before, "CONSUMER.LIST."+cfg.Stream) != nil
	})
}

// pollDenial calls cancel once denied reports a refusal, checking every
// denialPoll until ctx ends or the function it returns, which stops the
// poll and waits for it to end, is called.
func pollDenial(ctx context.Context, cancel context.CancelFunc, denied func() bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(denialPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if denied() {
				cancel()
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// lookDenial is the connection's last error when it is not before and is
// the server refusing the user a publish to the JetStream API subject
// rest (its subject after the API prefix); else nil.
func lookDenial(nc *nats.Conn, cfg *Config, before error, rest string) error {
	last := nc.LastError()
	if last == nil || last == before || !errors.Is(last, nats.ErrPermissionViolation) {
		return nil
	}
	// On the servers of nats.domain themselves, the server maps
	// $JS.<domain>.API to $JS.API before it checks the permission, and
	// names the subject it checked.
	t := last.Error()
	if strings.Contains(t, `"`+cfg.APIPrefix()+"."+rest+`"`) || strings.Contains(t, `"$JS.API.`+rest+`"`) {
		return last
	}
	return nil
}

// lookFailed is siblings' error for err, the failure of what, a
// JetStream API request to rest (its subject after the API prefix):
// errLookDenied when the server refused the user that publish
// (lookDenial); else, at a deadline, "no answer".
func lookFailed(nc *nats.Conn, cfg *Config, what, rest string, before, err error) error {
	if last := lookDenial(nc, cfg, before, rest); last != nil {
		return fmt.Errorf("%s: %w: the NATS user may not publish to %s (%w)", what, errLookDenied, apiSubjects(*cfg, rest), last)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%s: %w: nothing answers %s for this account (does it import JetStream's API without it?) (%w)",
			what, errLookUnrouted, apiSubjects(*cfg, rest), err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: no answer within %s (%w)", what, siblingLookTimeout, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// lookFix is the fix for siblings' error err.
func lookFix(cfg *Config, err error) string {
	if errors.Is(err, errLookUnrouted) {
		return "import (or export) " + apiSubjects(*cfg, "CONSUMER.LIST."+cfg.Stream) + " into the NATS user's account, beside " +
			apiSubjects(*cfg, "STREAM.INFO."+cfg.Stream)
	}
	if errors.Is(err, errLookDenied) {
		return "give the NATS user permission to publish to " + apiSubjects(*cfg, "CONSUMER.LIST."+cfg.Stream) +
			" (and " + apiSubjects(*cfg, "STREAM.INFO."+cfg.Stream) + ")"
	}
	if errors.Is(err, errLookIncomplete) {
		return fmt.Sprintf("see that the consumers named answer (nats consumer info %s <name> shows each one's metadata %s), or remove those no jetsink uses",
			shellWord(cfg.Stream), destinationKey)
	}
	return fmt.Sprintf("see that stream %s answers (nats consumer ls %s, which lists the durables to look at: nats consumer info shows each one's metadata %s)",
		cfg.Stream, shellWord(cfg.Stream), destinationKey)
}

// siblingLook is what siblings found.
type siblingLook struct {
	found    []*jetstream.ConsumerInfo // the durables of this destination
	held     uint64                    // how many events the stream holds
	subjects []string                  // the stream's subjects
	sourced  bool                      // the stream has sources or is a mirror
	cut      bool                      // the list was cut at siblingLimit
	// unanswered names the consumers that did not answer the server,
	// whose metadata was not read.
	unanswered []string
	// unrecorded names those of found that a jetsink made without
	// recording its destination (madeByJetsink): of this one, or not.
	unrecorded []string
}

// filters is cc's filter subjects, none for every subject.
func filters(cc *jetstream.ConsumerConfig) []string {
	theirs := slices.Clone(cc.FilterSubjects) // not appended to in cc
	if cc.FilterSubject != "" {
		theirs = append(theirs, cc.FilterSubject)
	}
	return theirs
}

// filtersOverlap reports whether a subject both cc's filter and filter
// ("" for every subject) let through may exist.
func filtersOverlap(cc *jetstream.ConsumerConfig, filter string) bool {
	theirs := filters(cc)
	if len(theirs) == 0 || filter == "" {
		return true
	}
	return slices.ContainsFunc(theirs, func(s string) bool { return pipeline.SubjectsOverlap(s, filter) })
}

// filterCovered reports whether every subject filter ("" for every
// subject of the stream, whose subjects are streamSubjects; sourced: it
// has sources or is a mirror) lets through, one of others' filters lets
// through too: only then did they deliver every event the new durable
// would below their ack floors, and may it start past the lowest.
// Wildcards are compared as patterns, not against the subjects the
// stream holds: filter in.> beside in.a and in.b is not covered, even
// when the stream holds no in.c.
func filterCovered(filter string, streamSubjects []string, sourced bool, others []*jetstream.ConsumerInfo) bool {
	ours := []string{filter}
	if filter == "" {
		ours = streamSubjects
		if sourced || len(ours) == 0 {
			// Sourced events keep their own subjects, outside the
			// stream's subjects (and transforms may rename them): a
			// durable of no filter delivers any subject.
			ours = []string{">"}
		}
	}
	var theirs []string
	for _, o := range others {
		fs := filters(&o.Config)
		if len(fs) == 0 {
			return true
		}
		theirs = append(theirs, fs...)
	}
	for _, s := range ours {
		if !slices.ContainsFunc(theirs, func(w string) bool { return subjectWithin(s, w) }) {
			return false
		}
	}
	return true
}

// subjectWithin reports whether every subject that pattern narrow
// matches, pattern wide matches too (in.a.* is within in.>; in.> is not
// within in.*).
func subjectWithin(narrow, wide string) bool {
	for {
		nt, nrest, nmore := strings.Cut(narrow, ".")
		wt, wrest, wmore := strings.Cut(wide, ".")
		switch {
		case wt == ">":
			return true
		case nt == ">", wt != "*" && nt != wt: // nt "*" is no literal wt
			return false
		case !nmore || !wmore:
			return nmore == wmore
		}
		narrow, wide = nrest, wrest
	}
}

// siblingProblem is the Problem of a new durable nats.consumer beside
// others (look.found), durables that jetsinks writing to this
// destination used (siblings). In at-least-once mode an error, which run
// refuses (Config: a bad nats.consumer; see ensureConsumer): the new
// durable stores again every event the others' jetsinks stored. In
// exactly-once mode (exactlyOnce) a warning: those are skipped as
// duplicates, but read again. interest: the stream has interest
// retention. made: the durable is being made now (the warning of
// lookForSiblings), not yet (check, and New's refusal).
func siblingProblem(cfg *Config, look siblingLook, exactlyOnce, interest, made bool) Problem {
	others := look.found
	var names, about []string
	floor := others[0].AckFloor.Stream
	for _, o := range others {
		names = append(names, o.Name)
		last := "has delivered nothing"
		if t := o.Delivered.Last; t != nil {
			last = "last delivered an event at " + t.UTC().Format(time.RFC3339)
		}
		unknown := ""
		if slices.Contains(look.unrecorded, o.Name) {
			unknown = "destination not recorded; "
		}
		about = append(about, fmt.Sprintf("%s (%sack floor at stream sequence %d, %s pending, %s)", o.Name, unknown, o.AckFloor.Stream,
			plural(o.NumPending, "event", "events"), last))
		floor = min(floor, o.AckFloor.Stream)
	}
	used := fmt.Sprintf("that a jetsink writing to %q used (metadata key %s)", cfg.Destination, destinationKey)
	switch n := len(look.unrecorded); {
	case n == len(others):
		used = fmt.Sprintf("that an older jetsink made or used without recording where it writes (no metadata key %s): "+
			"it may have written to %q", destinationKey, cfg.Destination)
	case n > 0:
		used += fmt.Sprintf(" or that an older jetsink made or used without recording where it writes (no metadata key %s)", destinationKey)
	}
	msg := fmt.Sprintf("durable consumer %s does not exist yet, and stream %s has %s %s: %s; "+
		"a new durable delivers the stream from its start (%s)",
		cfg.Consumer, cfg.Stream, plural(len(others), "durable consumer", "durable consumers"), used,
		strings.Join(about, "; "), heldWords(look.held, cfg.FilterSubject))
	if exactlyOnce {
		msg += ": exactly-once skips those already stored, but reads them all again, and while a jetsink runs on " +
			strings.Join(names, " or ") + " both read every event"
	} else {
		msg += ", so those already stored are stored again (at-least-once), and while a jetsink runs on " +
			strings.Join(names, " or ") + " each event is stored twice"
	}
	covered := filterCovered(cfg.FilterSubject, look.subjects, look.sourced, others)
	if !covered {
		// Their floors say nothing of the subjects they leave out: a
		// durable made past them would never deliver those subjects'
		// events below, which no jetsink stored.
		msg += fmt.Sprintf("; %s lets through subjects that their filters (%s) leave out, so it cannot start past their ack floor: "+
			"it would never deliver the events on those subjects below it", newFilterWords(cfg.FilterSubject), theirFilters(others))
	}
	if interest {
		msg += "; this stream has interest retention: a durable left behind keeps every event it has not acknowledged until it is removed"
	}
	if look.cut {
		msg += fmt.Sprintf(" (only the stream's first %d consumers were looked at)", siblingLimit)
	}
	if len(look.unanswered) > 0 {
		msg += fmt.Sprintf(" (%s did not answer the look, and may be of this destination too)", unansweredWords(look.unanswered))
	}
	var rm []string
	for _, n := range names {
		rm = append(rm, "nats consumer rm "+shellWord(cfg.Stream)+" "+shellWord(n)+" --force")
	}
	fromStart := consumerAdd(cfg.Stream, cfg.Consumer, cfg.FilterSubject, "all")
	// The new durable is made before the old is removed: on a stream
	// with interest retention, removing it first deletes the events it
	// holds.
	// Exactly-once skips the events stored as duplicates: a durable from
	// the start reads them again, and stores none again.
	again, againing, onPurpose := "stores again what they stored", "storing again what they stored", "store the stream again on purpose"
	if exactlyOnce {
		again, againing, onPurpose = "reads again what they stored (exactly-once skips each as stored already)",
			"reading again what they stored (exactly-once skips each as stored already)", "read the stream again on purpose"
	}
	var fix string
	lowest := ""
	if len(others) > 1 {
		lowest = " (the lowest of their ack floors)"
	}
	past := consumerAdd(cfg.Stream, cfg.Consumer, cfg.FilterSubject, deliverAfter(floor))
	stale := "(the floor as it is now: one that moved since, which nats consumer info shows, stores fewer again)"
	switch {
	case made && covered:
		// Made, and maybe consuming by the time this is read: from the
		// start, it stored again what it has acknowledged; made again
		// past their floor it would store again what it acknowledged
		// above it.
		fix = fmt.Sprintf("if nats.consumer was renamed: stop this jetsink and those on %s; then, if %s's ack floor (nats consumer info %s %s) is below theirs%s, "+
			"remove it (nats consumer rm %s %s --force) and make it again past theirs: %s %s; then remove the old: %s. "+
			"To %s, keep %s as made, and remove the old",
			strings.Join(names, " and "), cfg.Consumer, shellWord(cfg.Stream), shellWord(cfg.Consumer), lowest,
			shellWord(cfg.Stream), shellWord(cfg.Consumer), past, stale, strings.Join(rm, "; "), onPurpose, cfg.Consumer)
	case made:
		fix = fmt.Sprintf("if nats.consumer was renamed: %s, just made from the start of the stream, %s "+
			"(past their ack floor it would skip for good the events below it on the subjects their filters leave out): "+
			"stop the jetsinks on %s, and remove the old: %s",
			cfg.Consumer, again, strings.Join(names, " and "), strings.Join(rm, "; "))
	case covered:
		fix = fmt.Sprintf("if nats.consumer was renamed: stop the jetsinks on %s; before %s's first start make it past their ack floor%s: %s %s; "+
			"then remove the old: %s. To %s, make it from the start instead (%s), then remove the old",
			strings.Join(names, " and "), cfg.Consumer, lowest, past, stale, strings.Join(rm, "; "), onPurpose, fromStart)
	default:
		fix = fmt.Sprintf("if nats.consumer was renamed: stop the jetsinks on %s; before %s's first start make it from the start of the stream, "+
			"%s (not past their ack floor, which would skip for good the events below it on the subjects their filters leave out): %s; "+
			"then remove the old: %s",
			strings.Join(names, " and "), cfg.Consumer, againing, fromStart, strings.Join(rm, "; "))
	}
	if len(look.unrecorded) > 0 {
		// Recorded, a durable of another destination is not this one's:
		// New looks again at the next start.
		fix += fmt.Sprintf(". If %s wrote elsewhere, run a current jetsink on it once (its own configuration), so that it records where it writes "+
			"(metadata key %s), then start this one again", strings.Join(look.unrecorded, " and "), destinationKey)
	}
	if exactlyOnce {
		return Problem{Warning: true, Message: msg, Fix: fix}
	}
	return Problem{Config: true, Message: msg, Fix: fix}
}

// unseenSiblingsProblem is the warning of a new durable nats.consumer
// when siblings found none of this destination among the stream's first
// siblingLimit consumers, and did not look at the others. made: the
// durable is being made now (lookForSiblings), not yet (check).
func unseenSiblingsProblem(cfg *Config, made bool) Problem {
	look := fmt.Sprintf("nats consumer info %s <old> shows the old durable's metadata %s, ack floor and filter", shellWord(cfg.Stream), destinationKey)
	past := consumerAdd(cfg.Stream, cfg.Consumer, cfg.FilterSubject, floorPlaceholder)
	fix := fmt.Sprintf("if nats.consumer was renamed (%s): stop its jetsinks; before %s's first start make it past the old one's ack floor, %s, "+
		"when the old one's filter lets through every subject nats.filter_subject does (else from the start, --deliver all); then remove the old",
		look, cfg.Consumer, past)
	if made {
		// Made, and maybe consuming by the time this is read: made
		// again past the old one's floor it would store again what it
		// acknowledged above it.
		fix = fmt.Sprintf("if nats.consumer was renamed (%s): stop this jetsink and the old one's; then, when the old one's filter lets through "+
			"every subject nats.filter_subject does and %s's ack floor (nats consumer info %s %s) is below the old one's, "+
			"remove it (nats consumer rm %s %s --force) and make it again past the old one's ack floor, %s; then remove the old",
			look, cfg.Consumer, shellWord(cfg.Stream), shellWord(cfg.Consumer), shellWord(cfg.Stream), shellWord(cfg.Consumer), past)
	}
	again := "would store again"
	if cfg.StoredSeq != nil {
		again = "would read again (exactly-once skips each as stored already)"
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("durable consumer %s does not exist yet, and is made from the start of the stream; only the first %d consumers of stream %s "+
			"were looked at for other durable consumers of this destination: the events one after them delivered, %s %s",
			cfg.Consumer, siblingLimit, cfg.Stream, cfg.Consumer, again),
		Fix: fix}
}

// newFilterWords names the subjects a new durable of filter delivers.
func newFilterWords(filter string) string {
	if filter == "" {
		return "no nats.filter_subject (every subject of the stream)"
	}
	return "nats.filter_subject " + filter
}

// theirFilters lists others' filters, each "every subject" when it has
// none.
func theirFilters(others []*jetstream.ConsumerInfo) string {
	var all []string
	for _, o := range others {
		fs := filters(&o.Config)
		if len(fs) == 0 {
			fs = []string{"every subject"}
		}
		all = append(all, o.Name+": "+strings.Join(fs, ", "))
	}
	return strings.Join(all, "; ")
}

// heldWords says which of a stream's held events a new durable of
// filter delivers.
func heldWords(held uint64, filter string) string {
	if filter == "" {
		return fmt.Sprintf("its %d events", held)
	}
	return fmt.Sprintf("of its %d events, those nats.filter_subject %s matches", held, filter)
}

// plural is "1 one" or "n many".
func plural[N int | uint64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// lookForSiblings is ensureConsumer's look, before it makes durable
// nats.consumer from the start of the stream, at the stream's other
// durables of this destination (siblings): at New (starting) in
// at-least-once mode it refuses (ErrInvalidConfig, with check's words)
// when there are some; else it warns, as it does when it found none
// among the first siblingLimit and did not look further. A look the
// server refused for want of permission is a warning (an account may
// lack CONSUMER.LIST: a lasting choice, which would stop jetsink for
// good). A look that got no answer, or not from every consumer, refuses
// at New in at-least-once mode with an error that is not
// ErrInvalidConfig (run exits non-zero, and its supervisor starts it
// again, to look again); else it is a warning.
func (c *Consumer) lookForSiblings(ctx context.Context, starting bool) error {
	cfg := &c.cfg
	exactlyOnce := cfg.StoredSeq != nil
	refuse := !exactlyOnce && starting
	look, err := siblings(ctx, c.js, cfg)
	if err != nil {
		if refuse && !lookBarred(err) {
			return fmt.Errorf("could not look at the stream's consumers: %w; not making durable consumer %s from the start of the stream, "+
				"which could store again the events another durable of this destination stored (a renamed nats.consumer); "+
				"fix: %s; started again, jetsink looks again", err, cfg.Consumer, lookFix(cfg, err))
		}
		c.log.Warn("could not look for other durable consumers of this destination, whose events a new durable would store again: "+err.Error(),
			"fix", lookFix(cfg, err))
		return nil
	}
	if len(look.found) == 0 {
		if look.cut {
			p := unseenSiblingsProblem(cfg, true)
			c.log.Warn(p.Message, "fix", p.Fix)
		}
		return nil
	}
	p := siblingProblem(cfg, look, exactlyOnce, c.interest.Load(), !refuse)
	if refuse {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, p)
	}
	var names []string
	for _, o := range look.found {
		names = append(names, o.Name)
	}
	c.log.Warn(p.Message, "fix", p.Fix, "other_consumers", names) // the logger names the consumer
	return nil
}
