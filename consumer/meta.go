package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// metaTimeout bounds one read or update of the consumer's metadata.
const metaTimeout = 10 * time.Second

// strandedKey is where jetsink versions whose durable had a MaxDeliver kept
// the events the server had given up on before their dead letter was
// stored ("<stream_seq>:<deliveries>:<stream created, Unix ns>", comma
// separated). JetStream does not deliver those again and nothing reads
// the record now, so New logs it and check reports it.
const strandedKey = "jetsink_max_deliver_pending"

// filterKey is where jetsink records, in the consumer's metadata, the
// filter it set (nats.filter_subject, "" for none), and filterSetAtKey
// when it set it. An operator's edit of the filter (nats consumer edit)
// leaves them alone, so a filter the server has that differs from the
// record is an edit, set back (refreshFloor); one that matches it was set
// by another jetsink of the durable, configured otherwise (a rolling
// update that changes nats.filter_subject), and is kept for filterKeep
// since this process first saw it: setting it back at once would have the
// two swap it every floorEvery, each swap skipping events for good (the
// server does not go back). Past filterKeep it is set back as an edit is: the
// jetsink that set it may have stopped (an old instance restarted
// mid-rollout, a one-off run against the durable), and keeping it for
// ever would skip this one's events for as long as it runs.
const filterKey = "jetsink_filter_subject"

// filterSetAtKey records when jetsink set the filter recorded under
// filterKey, and which: "<RFC 3339 UTC> <filter>" (a subject has no
// spaces; the filter may be ""), for an operator to read (nats consumer
// info). The keep does not count from it: it is the writer's clock, and
// a clock behind this host's by more than filterKeep would have the keep
// end at once (the swap every floorEvery again), one ahead would keep a
// filter nobody runs for as long as it is ahead. The keep counts from
// when this process first saw the filter, on its own clock.
const filterSetAtKey = "jetsink_filter_set_at"

// destinationKey is where jetsink records, in the consumer's metadata,
// where the instance that last applied its configuration writes
// (Config.Destination): instances sharing a durable share its events,
// each event going to one of them, so two writing to two destinations
// split the stream between them, silently. New warns when the record
// names another destination and records its own, and so does each look
// at the consumer while it runs (refreshFloor, every floorEvery): while
// two such instances run, both keep warning; once the other has gone the
// record stays this one's and the warnings stop. Check reports it.
const destinationKey = "jetsink_destination"

// destinationProblem is the warning for durable consumer name whose
// record (destinationKey) names recorded, another destination than ours;
// ok is false when either is "" or they are the same. A warning, not an
// error: a durable moved to a new destination on purpose, its old
// instances stopped, shows the old record until run records the new one.
func destinationProblem(name, recorded, ours string) (p Problem, ok bool) {
	if recorded == "" || ours == "" || recorded == ours {
		return Problem{}, false
	}
	return Problem{Warning: true,
		Message: fmt.Sprintf("durable consumer %s was last used by a jetsink writing to %q (its metadata key %s), and this one writes to %q: "+
			"jetsinks sharing a durable consumer split its events, each event going to one of them, so while both run each destination "+
			"gets only some of the stream's events", name, recorded, destinationKey, ours),
		Fix: fmt.Sprintf("give each destination its own nats.consumer; if this is a move from %q and the jetsinks writing there are stopped, "+
			"nothing to do: run records the new destination", recorded)}, true
}

// recordDestination records Config.Destination under destinationKey in
// the consumer's metadata, changing nothing else of the consumer as the
// server has it (not its filter or its record, nor settings another
// jetsink of the durable applied, which consumerConfig would set back to
// this one's); a record naming it already is left alone. Within ctx.
func (c *Consumer) recordDestination(ctx context.Context) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	meta, prev, err := c.currentMeta(ctx)
	if err != nil {
		return err
	}
	if prev == nil {
		return fmt.Errorf("consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Stream, jetstream.ErrConsumerNotFound)
	}
	if meta[destinationKey] == c.cfg.Destination {
		return nil
	}
	meta[destinationKey] = c.cfg.Destination
	cc := *prev
	cc.Metadata = meta
	cc.PauseUntil = nil // the server keeps a pause through an update
	_, err = c.js.UpdateConsumer(ctx, c.cfg.Stream, cc)
	return err
}

// defaultFilterKeep is how long after this process first sees a filter
// another jetsink of the durable set it keeps it (Consumer.filterKeep):
// longer than a rolling update takes to replace the instances, short
// enough that a filter nobody runs any more does not skip events for long.
const defaultFilterKeep = 5 * time.Minute

// filterSetAt is filterSetAtKey's value for filter f set at t.
func filterSetAt(t time.Time, f string) string {
	return t.UTC().Format(time.RFC3339) + " " + f
}

// othersFilter reports the filter cc has if another jetsink set it: the
// one recorded under filterKey, cc's own, and not nats.filter_subject;
// and when this process first saw it (see filterSetAtKey for why not the
// recorded time). Safe for concurrent use.
func (c *Consumer) othersFilter(cc *jetstream.ConsumerConfig) (string, time.Time, bool) {
	c.filterSeenMu.Lock()
	defer c.filterSeenMu.Unlock()
	var f string
	ok := cc != nil
	if ok {
		f, ok = cc.Metadata[filterKey]
	}
	if !ok || !sameFilter(cc, f) || f == c.cfg.FilterSubject {
		c.filterSeen = nil
		return "", time.Time{}, false
	}
	if c.filterSeen == nil || c.filterSeen.filter != f {
		c.filterSeen = &seenFilter{filter: f, at: time.Now()}
	}
	return f, c.filterSeen.at, true
}

// seenFilter is another jetsink's filter, and when this process first
// saw it.
type seenFilter struct {
	filter string
	at     time.Time
}

// keepsOthers reports whether another jetsink's filter first seen at at
// is kept still (filterKeep).
func (c *Consumer) keepsOthers(at time.Time) bool {
	return time.Since(at) < c.filterKeep
}

// strandedProblem says what to do about a leftover strandedKey record v.
func strandedProblem(v string) Problem {
	return Problem{
		Message: fmt.Sprintf("the consumer's metadata key %s lists events an earlier jetsink could not dead-letter after JetStream "+
			"gave up on them (stream_seq:deliveries:stream created): %s; JetStream will not deliver them again", strandedKey, v),
		Fix: "copy each to the dead-letter subject (nats stream get), then remove the key (nats consumer edit)",
	}
}

// errCodeMaxAckPendingExcess is the server's error code for a consumer
// asking a max_ack_pending above a limit of the stream's
// (consumer_limits), the account's or the server's
// (JSConsumerMaxPendingAckExcessErrF).
const errCodeMaxAckPendingExcess jetstream.ErrorCode = 10121

// ackPendingExcess says whose limit refused, with errCodeMaxAckPendingExcess
// (refused), a durable asking max_ack_pending want, and what to do: the
// server raises that code for its own jetstream limits, the account's and
// the stream's consumer_limits alike, naming only the number. The stream's
// and the account's are looked at now (a failed look counts as no limit).
func (c *Consumer) ackPendingExcess(ctx context.Context, refused *jetstream.APIError, want int) string {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	stream, account := 0, 0
	if limits, ok := c.streamLimits(ctx); ok {
		stream = limits.MaxAckPending
	}
	if ai, err := c.js.AccountInfo(ctx); err == nil {
		account = ai.Limits.MaxAckPending
	}
	return ackPendingExcessFix(&c.cfg, want, refusedLimit(refused), stream, account)
}

// refusedLimit is the limit an errCodeMaxAckPendingExcess refusal names
// ("consumer max ack pending exceeds system limit of 500"), 0 when it
// names none.
func refusedLimit(refused *jetstream.APIError) int {
	_, n, ok := strings.Cut(refused.Description, "limit of ")
	if !ok {
		return 0
	}
	limit, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || limit <= 0 {
		return 0
	}
	return limit
}

// ackPendingExcessFix says whose max_ack_pending limit refused a durable
// asking want, and how to lift it: limit is the one the refusal named (0:
// unknown), stream the stream's consumer_limits.max_ack_pending, account
// the account's JetStream limit (0 or less: none). The server checks its
// own first, then the account's, then the stream's; so a refusal whose
// number is neither the stream's nor the account's is the server's, which
// no client request shows.
func ackPendingExcessFix(cfg *Config, want, limit, stream, account int) string {
	below := func(l int) bool { return l > 0 && l < want }
	is := func(l int) bool { return below(l) && (limit == 0 || l == limit) }
	// Set to the refusing limit alone, the next refuses in turn.
	most := limit
	for _, l := range []int{stream, account} {
		if below(l) && (most == 0 || l < most) {
			most = l
		}
	}
	also := ""
	if most != limit && limit > 0 {
		also = fmt.Sprintf(" (%d: the lowest limit, of the stream's and the account's, also below jetsink's)", most)
	}
	switch {
	case is(account):
		return fmt.Sprintf("the account's JetStream limit max_ack_pending is %d: set nats.max_ack_pending, %d, to %d or less%s, or raise "+
			"the account's limit (max_ack_pending in the account's jetstream block of the server's configuration, or in its JWT)", account, want, most, also)
	case is(stream):
		return fmt.Sprintf("stream %s's consumer_limits.max_ack_pending is %d: set nats.max_ack_pending, %d, to %d or less%s, or remove "+
			"the stream's limit (set its consumer_limits.max_ack_pending to 0: %s, or --config <a file of it>)",
			cfg.Stream, stream, want, most, also, streamEdit(cfg.Stream, "--interactive"))
	case limit > 0:
		return fmt.Sprintf("neither the stream's consumer_limits nor the account's JetStream limits hold it, so it is the server's own: "+
			"set nats.max_ack_pending, %d, to %d or less%s, or raise max_ack_pending in the limits block of the jetstream block of "+
			"the servers' configuration", want, most, also)
	}
	return fmt.Sprintf("set nats.max_ack_pending, %d, to that limit or less, or raise it: the stream's consumer_limits.max_ack_pending, "+
		"the account's JetStream limit max_ack_pending, or the servers' jetstream limits", want)
}

// consumerConfig is the durable consumer as jetsink wants it, with meta as
// its metadata. Its MaxDeliver is unlimited (durableMaxDeliver) whatever
// nats.max_deliver says; the server accepts that change on an existing
// consumer, so a durable made before with a limit is updated by
// ensureConsumer. prev, if not nil, is the consumer's configuration on the
// server: what the server does not let an update change (where delivery
// starts, the storage, the replay policy, how many pulls may wait) is kept
// from it, so that a durable its owner made (say, to deliver only new
// messages) is taken as it is; so is its replica count, which an operator
// may have set apart from the stream's. (Its pause the server keeps
// through an update by itself.) Its filter is nats.filter_subject,
// recorded in meta under filterKey, and when it was set under
// filterSetAtKey (kept from prev if prev has that filter recorded with a
// time); but after New's update (filterApplied) a filter another jetsink
// recorded on the server (othersFilter) is kept, record and all, until
// filterKeep has passed since this process first saw it (keepsOthers).
// metaMu held.
func (c *Consumer) consumerConfig(meta map[string]string, prev *jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	cfg := &c.cfg
	if meta == nil {
		meta = map[string]string{}
	}
	prevSetAt := ""
	if prev != nil && sameFilter(prev, cfg.FilterSubject) && prev.Metadata[filterKey] == cfg.FilterSubject {
		prevSetAt = prev.Metadata[filterSetAtKey] // already set, and when
	}
	if ts, f, _ := strings.Cut(prevSetAt, " "); f == cfg.FilterSubject && ts != "" {
		meta[filterSetAtKey] = prevSetAt
	} else {
		meta[filterSetAtKey] = filterSetAt(time.Now(), cfg.FilterSubject)
	}
	meta[filterKey] = cfg.FilterSubject
	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    durableMaxDeliver,
		MaxAckPending: cfg.maxAckPending(),
		FilterSubject: cfg.FilterSubject,
		Metadata:      meta,
	}
	if prev != nil {
		cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = prev.DeliverPolicy, prev.OptStartSeq, prev.OptStartTime
		cc.MemoryStorage = prev.MemoryStorage
		cc.MaxWaiting, cc.ReplayPolicy = prev.MaxWaiting, prev.ReplayPolicy
		cc.Replicas = prev.Replicas
		if f, at, ok := c.othersFilter(prev); ok && c.filterApplied && c.keepsOthers(at) {
			cc.FilterSubject, cc.FilterSubjects = prev.FilterSubject, prev.FilterSubjects
			meta[filterKey] = f
			if v, ok := prev.Metadata[filterSetAtKey]; ok {
				meta[filterSetAtKey] = v
			} else {
				delete(meta, filterSetAtKey)
			}
		}
	}
	return cc
}

// currentMeta reads the consumer's metadata as the server has it now,
// without the keys the server sets itself ("_nats." ...), and its
// configuration (nil, nil, nil when there is no consumer yet).
func (c *Consumer) currentMeta(ctx context.Context) (map[string]string, *jetstream.ConsumerConfig, error) {
	meta, info, err := c.currentInfo(ctx)
	if info == nil {
		return meta, nil, err
	}
	return meta, &info.Config, err
}

// currentInfo is currentMeta with the consumer's info (its ack floor),
// whose Config is the configuration currentMeta returns.
func (c *Consumer) currentInfo(ctx context.Context) (map[string]string, *jetstream.ConsumerInfo, error) {
	// A push consumer too: ensureConsumer refuses it.
	info, err := durableInfo(ctx, c.js, c.cfg.Stream, c.cfg.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("look up consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Stream, err)
	}
	info = new(*info) // not the client's cached copy, whose Config the callers change
	meta := map[string]string{}
	for k, v := range info.Config.Metadata {
		if !strings.HasPrefix(k, "_nats.") {
			meta[k] = v
		}
	}
	return meta, info, nil
}

// ensureConsumer creates or updates the durable pull consumer and publishes
// its handle for Run and Lag. It keeps the consumer's metadata as the
// server has it, with set's keys set. A durable that is not an
// explicit-ack pull consumer, which no update can change, it refuses
// (ErrInvalidConfig, with check's words and fix) before asking the server;
// one whose replay policy is original it takes, and warns of, as check
// does. It records Config.Destination (destinationKey), warning first, as
// check reports, when the record names another. A durable it makes from
// the start of the stream beside another of this destination
// (lookForSiblings) it refuses at New in at-least-once mode
// (ErrInvalidConfig), and warns of otherwise.
func (c *Consumer) ensureConsumer(ctx context.Context, set map[string]string) error {
	cfg := &c.cfg
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	meta, info, err := c.currentInfo(ctx)
	if err != nil {
		return err
	}
	var prev *jetstream.ConsumerConfig
	if info != nil {
		prev = &info.Config
	}
	if len(set) > 0 && meta == nil {
		meta = map[string]string{}
	}
	maps.Copy(meta, set)
	if v := meta[strandedKey]; v != "" {
		p := strandedProblem(v)
		c.log.Error(p.Message, "fix", p.Fix)
	}
	if prev != nil && c.resumeUnsure {
		// Made by this process past an ack floor, and its stream could not
		// be confirmed after: should it be another stream now, its events
		// below the start would never be delivered.
		same, err := c.floorStream(ctx)
		if err != nil {
			return err
		}
		if !same {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metaTimeout)
			err := c.js.DeleteConsumer(dctx, cfg.Stream, cfg.Consumer)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("delete consumer %s, made past the ack floor of a stream %s replaced since: %w", cfg.Consumer, cfg.Stream, err)
			}
			c.log.Warn("stream replaced just after the consumer was made past its old ack floor: made again from the start")
			prev = nil
		}
		c.resumeUnsure = false
	}
	if prev != nil {
		// The server would refuse the update with its own words alone
		// ("ack policy can not be updated").
		if p, ok := foreignDurableProblem(cfg.Consumer, prev); ok {
			p.Fix += holdFirst(cfg, floorPlaceholder, c.interest.Load())
			return fmt.Errorf("%w: %s", ErrInvalidConfig, p)
		}
		if p, ok := durableReplicaProblem(clusterOf(c.nc, cfg), cfg.Stream, int(c.streamReplicas.Load()), prev); ok && !c.durableReplicasWarned.Swap(true) {
			c.log.Warn(p.Message, "fix", p.Fix) // kept by buildConfig: said once
		}
		sc := jetstream.StreamConfig{Storage: jetstream.StorageType(c.streamStorage.Load()), Retention: jetstream.LimitsPolicy}
		switch {
		case c.interest.Load():
			sc.Retention = jetstream.InterestPolicy
		case c.workQueue.Load():
			sc.Retention = jetstream.WorkQueuePolicy
		}
		if p, ok := memoryDurableProblem(cfg, &sc, prev); ok && !c.memoryDurableWarned.Swap(true) {
			c.log.Warn(p.Message, "fix", p.Fix) // kept by consumerConfig: said once
		}
		if p, ok := maxWaitingProblem(cfg, sc.Retention, prev); ok && !c.maxWaitingWarned.Swap(true) {
			c.log.Warn(p.Message, "fix", p.Fix) // kept by consumerConfig: said once
		}
	}
	if cfg.Destination != "" {
		// Recorded for the others of the durable (refreshFloor).
		if p, ok := destinationProblem(cfg.Consumer, meta[destinationKey], cfg.Destination); ok {
			c.log.Warn(p.Message, "fix", p.Fix, "recorded_destination", meta[destinationKey], "destination", cfg.Destination)
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[destinationKey] = cfg.Destination
	}
	cc := c.consumerConfig(meta, prev)
	// Whether another jetsink's filter is kept is decided once, by
	// consumerConfig: deciding again here could differ (the keep may
	// end in between), and warn of a change not made, or not of one made.
	if prev != nil && !sameFilter(prev, cfg.FilterSubject) && sameFilter(&cc, cfg.FilterSubject) {
		// The server swaps the filter without going back (refreshFloor).
		msg := "changing the consumer's filter to nats.filter_subject: it keeps its place in the stream, so events on subjects " +
			"the old filter left out that lie before that place are not delivered"
		args := []any{"filter_subject", prev.FilterSubject, "filter_subjects", prev.FilterSubjects,
			"nats.filter_subject", cfg.FilterSubject}
		if c.filterApplied && !c.filterEditSaid {
			// Set on the server since jetsink applied its own, and not
			// yet said by a look (refreshFloor): a session that ended
			// for another reason before the look. The floor to make
			// the durable again past is now or never: once the filter
			// is jetsink's again, the next look notes the floor the
			// server moved past the events skipped.
			c.log.Error(msg+"; to have them delivered, "+c.remakeAfterEdit(info),
				append(args, "ack_floor", info.AckFloor.Stream, "delivered", info.Delivered.Stream)...)
			// Said: an update that fails, retried every few seconds,
			// warns from now on (cleared once the update succeeds).
			c.filterEditSaid = true
		} else if !c.filterApplied && filterTakesMore(prev, cfg.FilterSubject) {
			// nats.filter_subject changed between runs, taking subjects
			// the old filter left out: where the durable is, and how to
			// take those events; a pure narrowing skips nothing.
			c.log.Warn(msg+"; "+widenedFilterSteps(cfg, c.interest.Load(), c.streamFirstSeq(ctx)),
				append(args, widenedFilterPlace(info)...)...)
		} else {
			c.log.Warn(msg, args...)
		}
	}
	resumed := false
	if prev == nil {
		if resumed, err = c.resumeAfterFloor(ctx, &cc); err != nil {
			return err
		}
	}
	if prev == nil && !resumed {
		// Made from the start of the stream: the events another
		// durable of this destination delivered are stored again (a
		// renamed nats.consumer). Refused at New only: a running
		// jetsink whose durable went keeps running, warned.
		if err := c.lookForSiblings(ctx, c.starting); err != nil {
			return err
		}
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if apiErr := (*jetstream.APIError)(nil); errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMaxAckPendingExcess {
		return fmt.Errorf("create or update consumer %s on stream %s: %w (%s)", cfg.Consumer, cfg.Stream, err,
			c.ackPendingExcess(ctx, apiErr, cc.MaxAckPending))
	}
	if err != nil {
		return fmt.Errorf("create or update consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	if resumed {
		// A stream that replaced that one between the look and now would
		// never deliver its events below the start: look again, and until
		// that look says the same stream, do not use the consumer (the
		// next call deletes it if the stream is another).
		if same, err := c.floorStream(ctx); err != nil || !same {
			c.resumeUnsure = true
			return fmt.Errorf("consumer %s made past the ack floor of stream %s, which was replaced meanwhile or could not be looked at: %w",
				cfg.Consumer, cfg.Stream, cmp.Or(err, errStreamChanged))
		}
	}
	if why := pullLimits(cons.CachedInfo().Config, cfg); why != "" {
		// The server's own limits (its jetstream limits fill in what the
		// update left 0): every pull would be refused.
		return fmt.Errorf("%w: consumer %s refuses jetsink's pulls: %s", ErrInvalidConfig, cfg.Consumer, why)
	}
	// The consumer's max_request_batch lowers a derived pull_max_messages.
	limit := int64(cons.CachedInfo().Config.MaxRequestBatch)
	if old := c.batchLimit.Swap(limit); old != limit && cfg.PullMaxMessages == 0 && limit > 0 && int(limit) < cfg.PullMessages() {
		c.log.Info("pulling fewer messages at a time than derived: the consumer's max_request_batch (the server's jetstream limits) allows no more",
			"pull_max_messages", limit)
	}
	if p, ok := replayOriginalProblem(cfg.Consumer, &cons.CachedInfo().Config); ok {
		c.log.Warn(p.Message, "fix", p.Fix+holdFirst(cfg, floorPlaceholder, c.interest.Load()))
	}
	if prev == nil {
		// Made anew: a pause of the one deleted went with it (the next
		// look would say it is over); a loss after this one is said again.
		c.serverPaused.Store(false)
		c.goneSaid = false
	}
	if info := cons.CachedInfo(); info.Paused && !c.serverPaused.Swap(true) {
		c.log.Warn("the consumer is paused (nats consumer resume, or its pause time): nothing is delivered until then",
			"resumes_in", info.PauseRemaining.Round(time.Second))
	}
	if cc.Metadata[filterKey] == cfg.FilterSubject {
		// Its own filter applied: another's, set again, is seen anew.
		c.filterSeenMu.Lock()
		c.filterSeen = nil
		c.filterSeenMu.Unlock()
	}
	c.filterApplied = true
	c.filterEditSaid = false
	c.cons.Store(&consumerHandle{cons})
	return nil
}

// resumeAfterFloor has cc, a consumer to make again on a stream a session
// of this process consumed, start past the ack floor last known for it
// (noteFloor) rather than at the start of the stream, as a new durable
// would: in at-least-once mode that stored every event the stream still
// held again. Not when the stream was replaced since (floorStream), nor
// when nothing is known (the first start, a restart after the consumer
// went), nor on a work-queue stream: the server refuses there a consumer
// that does not deliver all ("consumer must be deliver all on workqueue
// stream"), every retry, for as long as jetsink ran; and needs none, as
// it deleted the events acked, so delivering all starts past them. It
// reports whether it did; an error when it could not look at the stream.
// It says so once a loss of the consumer (goneSaid), not at each retry.
// metaMu held.
func (c *Consumer) resumeAfterFloor(ctx context.Context, cc *jetstream.ConsumerConfig) (bool, error) {
	floor := c.resumeFloor.Load()
	if floor == 0 {
		return false, nil
	}
	if c.workQueue.Load() {
		if !c.goneSaid {
			c.log.Warn("consumer gone; making it again: on a work-queue stream it delivers from the first event not acked, "+
				"those acked being deleted", "ack_floor", floor)
			c.goneSaid = true
		}
		return false, nil
	}
	if same, err := c.floorStream(ctx); err != nil || !same {
		return false, err
	}
	cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	if !c.goneSaid {
		c.log.Warn("consumer gone; making it again past its last known ack floor, not from the start of the stream",
			"start_seq", cc.OptStartSeq, "hint", "to consume the stream from its start again, stop jetsink before deleting the consumer")
		c.goneSaid = true
	}
	return true, nil
}

// floorStream reports whether the stream is still the one the ack floor
// was learnt on: the same creation time, and a last sequence not below the
// floor (a stream restored from a backup, or rebuilt in a cluster, keeps
// its creation time while its sequence goes back).
func (c *Consumer) floorStream(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return false, fmt.Errorf("look up stream %s: %w", c.cfg.Stream, err)
	}
	info := stream.CachedInfo()
	return info.Created.Equal(c.resumeStream) && info.State.LastSeq >= c.resumeFloor.Load(), nil
}

// updateMeta rewrites the consumer's metadata: as the server has it, with
// change applied, so that keys others set stay, within metaTimeout; not
// cut short when ctx ends (a shutdown): the marks it writes keep a restart
// from taking a replaced stream for a new one. The filter, and its record
// (filterKey, filterSetAtKey), stay as the server has them: set back here,
// an operator's edit, or another jetsink's filter past its keep, went
// unseen, with no Error line giving the ack floor from which to recover
// the events it skipped, and the next look (refreshFloor) found jetsink's
// own. Setting it back is refreshFloor's and ensureConsumer's, which say
// so. metaMu held.
func (c *Consumer) updateMeta(ctx context.Context, change func(map[string]string)) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metaTimeout)
	defer cancel()
	meta, prev, err := c.currentMeta(ctx)
	if err != nil {
		return err
	}
	if prev == nil {
		return fmt.Errorf("consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Stream, jetstream.ErrConsumerNotFound)
	}
	change(meta)
	cc := c.consumerConfig(meta, prev)
	cc.FilterSubject, cc.FilterSubjects = prev.FilterSubject, prev.FilterSubjects
	for _, k := range []string{filterKey, filterSetAtKey} {
		if v, ok := prev.Metadata[k]; ok {
			cc.Metadata[k] = v
		} else {
			delete(cc.Metadata, k)
		}
	}
	_, err = c.js.UpdateConsumer(ctx, c.cfg.Stream, cc)
	return err
}

// pullLimits says which of the consumer's limits on one pull (cc, as the
// server has it) refuse the pulls cfg makes, and what to set; "" for
// none.
func pullLimits(cc jetstream.ConsumerConfig, cfg *Config) string {
	var why []string
	if n := cc.MaxRequestBatch; n > 0 && cfg.PullMaxMessages > 0 && n < cfg.PullMaxMessages { // a derived one pulls fewer
		why = append(why, fmt.Sprintf("max_request_batch %d (set nats.pull_max_messages to %d or less)", n, n))
	}
	if d := cc.MaxRequestExpires; d > 0 && d < cfg.PullExpiry {
		why = append(why, fmt.Sprintf("max_request_expires %v (set nats.pull_expiry to %v or less)", d, d))
	}
	if n := cc.MaxRequestMaxBytes; n > 0 && (cfg.PullMaxBytes == 0 || cfg.PullMaxBytes > n) {
		why = append(why, fmt.Sprintf("max_request_max_bytes %d (set nats.pull_max_bytes to %d or less)", n, n))
	}
	return strings.Join(why, "; ")
}
