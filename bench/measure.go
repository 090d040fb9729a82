package bench

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
)

// Latencies are recorded in microseconds from 1 µs to 1 hour with 3
// significant digits.
const (
	histMin    = 1
	histMax    = int64(time.Hour / time.Microsecond)
	histDigits = 3
)

// Percentiles of a latency distribution, in milliseconds. Values outside
// the histograms' range are recorded at its edge and counted: BelowMin
// those under 1 µs (negative ones included: a clock that disagrees),
// AboveMax those over an hour.
type Percentiles struct {
	Count    int64   `json:"count"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p99_9_ms"`
	Max      float64 `json:"max_ms"`
	Mean     float64 `json:"mean_ms"`
	BelowMin int64   `json:"clamped_below_1us,omitempty"`
	AboveMax int64   `json:"clamped_above_1h,omitempty"`
}

// Clamped is how many values were recorded at the histogram's edge.
func (p Percentiles) Clamped() int64 { return p.BelowMin + p.AboveMax }

// hist is a latency histogram that counts the values it clamps into its
// range and keeps the largest value it recorded exactly: the histogram's
// own Max is the top of that value's bucket (3 significant digits), which
// reads up to 0.1% high, above the hour of its range for a value just
// under it.
type hist struct {
	h            *hdrhistogram.Histogram
	below, above int64
	max          int64 // µs, as recorded (clamped)
}

func newHist() *hist { return &hist{h: hdrhistogram.New(histMin, histMax, histDigits)} }

// record records d in whole microseconds, clamped into the range and
// counted when it was, and returns the value recorded.
func (h *hist) record(d time.Duration) int64 {
	us := d.Microseconds()
	switch {
	case us < histMin:
		h.below++
		us = histMin
	case us > histMax:
		h.above++
		us = histMax
	}
	_ = h.h.RecordValue(us) // within range: no error
	h.max = max(h.max, us)
	return us
}

// percentiles is h's distribution with its clamp counts; the zero
// Percentiles when h is empty.
func (h *hist) percentiles() Percentiles {
	if h.h.TotalCount() == 0 {
		return Percentiles{}
	}
	p := percentiles(h.h, h.max)
	p.BelowMin, p.AboveMax = h.below, h.above
	return p
}

// percentiles reads h's distribution; maxUS is the largest value recorded,
// exactly, which is the Max and caps the percentiles (each is the top of
// its value's bucket, which can lie above every value recorded).
func percentiles(h *hdrhistogram.Histogram, maxUS int64) Percentiles {
	ms := func(us int64) float64 { return float64(min(us, maxUS)) / 1000 }
	return Percentiles{
		Count: h.TotalCount(),
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(maxUS),
		Mean:  h.Mean() / 1000,
	}
}

// CurvePoint is one point of the percentile plot.
type CurvePoint struct {
	Percentile float64 `json:"percentile"`
	Ms         float64 `json:"ms"`
}

// curveQuantiles are the percentiles the percentile plot shows.
var curveQuantiles = []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 99.999, 100}

// TimePoint is one window of the latency-over-time plot.
type TimePoint struct {
	T     float64 `json:"t_s"` // window start, seconds after the first scheduled send
	Count int64   `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Batches describes rows per committed transaction.
type Batches struct {
	Count int     `json:"count"`
	Min   int64   `json:"min"`
	P50   int64   `json:"p50"`
	P90   int64   `json:"p90"`
	Max   int64   `json:"max"`
	Mean  float64 `json:"mean"`
}

// tableFacts is what the table says about one run.
type tableFacts struct {
	rows               int64
	duplicates         int64     // rows beyond the first of each stream_seq (count - count(DISTINCT); NULLs not counted)
	seqsStored         int64     // distinct stream_seq from 1 to the published count
	stray              int64     // rows whose stream_seq is not one of those (or NULL)
	first, last        time.Time // first and last commit
	latency            Percentiles
	toStream, inEngine Percentiles // split at published_at (JetStream's store time)
	// inEngine split again at the row's COPY (committed_at), when the
	// commit time is the real commit timestamp.
	beforeCopy, copyToCommit Percentiles
	delivery, inside         Percentiles // beforeCopy split at received_at (jetsink fills it)
	commitToAck              Percentiles // the commit timestamp to the ack's arrival (WAL flush, the ack's way)
	toCommit                 Percentiles // latency to the commit time, of every row, in runs that watch acks
	acked                    int64       // rows whose latency ends at their ack (the rest at their commit)
	curve                    []CurvePoint
	timeline                 []TimePoint
	batches                  Batches
}

// measureTable reads every row's scheduled time and commit time. byCommitTS
// uses pg_xact_commit_timestamp(xmin) (track_commit_timestamp on), else the
// committed_at column. A row's latency ends when its message's first ack
// arrived, when acks saw it (the rest end at the commit time), and starts at
// its scheduled send time or at from, whichever is later: a drain's events
// were sent before its engine started (so do the legs that start at the
// store time). Of the rows of one stream_seq, only the first committed
// counts. It counts the sequences 1 to
// published stored, so that a stray row cannot stand in for a lost one.
// window > 0 groups the latencies by scheduled send time for the
// latency-over-time plot, in windows counted from from (a rate run's first
// scheduled send, the zero of the RSS plot and of the lock's times too);
// 0 makes no timeline. Every time PostgreSQL wrote (commit and COPY
// times) is taken less clk.pg's offset, every stored time (published_at,
// nats-server's) less clk.nats's: on the host's clock, as ts, from,
// received_at (the engine's) and the acks are.
func measureTable(ctx context.Context, db *pgx.Conn, table string, byCommitTS bool, window time.Duration,
	acks *ackTimes, from time.Time, published int64, clk clocks) (tableFacts, error) {
	var f tableFacts
	t := pgx.Identifier{table}.Sanitize()
	commit := commitTime(byCommitTS)
	var first, last *time.Time
	if err := db.QueryRow(ctx, `SELECT count(*), count(stream_seq) - count(DISTINCT stream_seq),
		count(DISTINCT stream_seq) FILTER (WHERE stream_seq BETWEEN 1 AND $1),
		count(*) FILTER (WHERE stream_seq IS NULL OR stream_seq NOT BETWEEN 1 AND $1), min(`+commit+`), max(`+commit+`) FROM `+t, published).
		Scan(&f.rows, &f.duplicates, &f.seqsStored, &f.stray, &first, &last); err != nil {
		return f, fmt.Errorf("count rows: %w", err)
	}
	if f.rows == 0 {
		return f, nil
	}
	if first != nil && last != nil { // the first and last commit of any row, duplicates too
		f.first, f.last = first.Add(-clk.pg.Offset), last.Add(-clk.pg.Offset)
	}
	// A row without a stream_seq is counted stray above and has no latency
	// here (nothing says which publish it was).
	query := "SELECT stream_seq, ts, published_at, received_at, committed_at, " + commit + " FROM " + t + " WHERE stream_seq IS NOT NULL ORDER BY ts"
	if f.duplicates > 0 {
		// A duplicate row (a redelivery stored again) counts once, at
		// its first commit: the event was stored then. (A second sort;
		// only where there are duplicates.)
		query = "SELECT stream_seq, ts, published_at, received_at, committed_at, c FROM " +
			"(SELECT DISTINCT ON (stream_seq) stream_seq, ts, published_at, received_at, committed_at, " + commit + " AS c FROM " + t +
			" WHERE stream_seq IS NOT NULL ORDER BY stream_seq, c) d ORDER BY ts"
	}
	rows, err := db.Query(ctx, query)
	if err != nil {
		return f, fmt.Errorf("read latencies: %w", err)
	}
	all, toStream, inEngine, beforeCopy, copyToCommit := newHist(), newHist(), newHist(), newHist(), newHist()
	delivery, inside, commitToAck, toCommit := newHist(), newHist(), newHist(), newHist()
	// The timeline counts from from, the zero of the RSS plot and of the
	// lock's seconds, not from the first row's ts: that is the same
	// instant (to the microsecond PostgreSQL keeps) only if the first
	// event has a row; where the first events were lost, the windows and
	// their seconds were shifted against the other plots'.
	var win *hdrhistogram.Histogram
	var winMax int64 // µs, exactly
	winStart := from
	if window > 0 {
		win = hdrhistogram.New(histMin, histMax, histDigits)
	}
	flushWin := func() {
		if win != nil && win.TotalCount() > 0 {
			p := percentiles(win, winMax)
			f.timeline = append(f.timeline, TimePoint{T: winStart.Sub(from).Seconds(), Count: p.Count, P50: p.P50, P99: p.P99, Max: p.Max})
		}
	}
	for rows.Next() {
		var seq int64
		var ts, copied, at time.Time
		var stored, received *time.Time // NULL where the engine does not fill them
		if err := rows.Scan(&seq, &ts, &stored, &received, &copied, &at); err != nil {
			rows.Close()
			return f, fmt.Errorf("read latencies: %w", err)
		}
		copied, at = copied.Add(-clk.pg.Offset), at.Add(-clk.pg.Offset)
		if stored != nil {
			*stored = stored.Add(-clk.nats.Offset)
		}
		if d := ts.Sub(winStart); win != nil && d >= window {
			flushWin()
			win.Reset()
			winMax = 0
			winStart = winStart.Add(d / window * window) // past empty windows at once: the first row may be far from from
		}
		end := at
		if acked, ok := acks.get(seq); ok {
			end = acked
			f.acked++
			if byCommitTS {
				commitToAck.record(acked.Sub(at))
			}
		}
		if acks != nil {
			// Every row, whether its ack was seen or not: the same events
			// as the latency's.
			toCommit.record(at.Sub(later(ts, from)))
		}
		us := all.record(since(end, later(ts, from), from))
		if stored != nil {
			toStream.record(stored.Sub(ts))
			// From the store time or from, as the whole latency: in a
			// drain, the time stored before the engine started (the other
			// engine's run, with --compare) is not the engine's part.
			in := later(*stored, from)
			inEngine.record(at.Sub(in))
			if byCommitTS {
				beforeCopy.record(copied.Sub(in))
				copyToCommit.record(at.Sub(copied))
				if received != nil {
					delivery.record(received.Sub(in))
					inside.record(copied.Sub(*received))
				}
			}
		}
		if win != nil {
			_ = win.RecordValue(us)
			winMax = max(winMax, us)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return f, fmt.Errorf("read latencies: %w", err)
	}
	flushWin()
	f.latency = all.percentiles()
	f.toStream, f.inEngine = toStream.percentiles(), inEngine.percentiles()
	f.beforeCopy, f.copyToCommit = beforeCopy.percentiles(), copyToCommit.percentiles()
	f.delivery, f.inside = delivery.percentiles(), inside.percentiles()
	f.commitToAck, f.toCommit = commitToAck.percentiles(), toCommit.percentiles()
	for _, q := range curveQuantiles {
		v := min(all.h.ValueAtQuantile(q), all.max)
		if q == 0 {
			v = all.h.Min() // ValueAtQuantile(0) is the lowest bucket's start, 0
		}
		f.curve = append(f.curve, CurvePoint{Percentile: q, Ms: float64(v) / 1000})
	}

	brows, err := db.Query(ctx, "SELECT count(*) FROM "+t+" GROUP BY xmin")
	if err != nil {
		return f, fmt.Errorf("batch sizes: %w", err)
	}
	sizes, err := pgx.CollectRows(brows, pgx.RowTo[int64])
	if err != nil {
		return f, fmt.Errorf("batch sizes: %w", err)
	}
	f.batches = batchStats(sizes)
	return f, nil
}

// since is end - start, where start is from or later, on the wall clock
// (a row's ts: from plus its due time), and end is an ack's time (on the
// monotonic clock, as from is) or a commit's (on PostgreSQL's wall
// clock): counted from from, so that between an ack and from the
// monotonic clock counts and a step of the wall clock in the run does not.
func since(end, start, from time.Time) time.Duration {
	if from.IsZero() {
		return end.Sub(start) // (from the year 1, Sub would saturate)
	}
	return end.Sub(from) - start.Sub(from)
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func batchStats(sizes []int64) Batches {
	if len(sizes) == 0 {
		return Batches{}
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] < sizes[j] })
	var sum int64
	for _, s := range sizes {
		sum += s
	}
	at := func(q float64) int64 { return sizes[int(math.Ceil(q*float64(len(sizes))))-1] }
	return Batches{Count: len(sizes), Min: sizes[0], P50: at(0.5), P90: at(0.9), Max: sizes[len(sizes)-1],
		Mean: float64(sum) / float64(len(sizes))}
}

// lastCommitSentBy returns the commit time of the last row of table whose
// event was scheduled at or before t: when everything sent by then was in,
// on the host's clock (PostgreSQL's less pgOffset).
func lastCommitSentBy(ctx context.Context, db *pgx.Conn, table string, byCommitTS bool, t time.Time, pgOffset time.Duration) (time.Time, error) {
	commit := commitTime(byCommitTS)
	var last *time.Time
	if err := db.QueryRow(ctx, "SELECT max("+commit+") FROM "+pgx.Identifier{table}.Sanitize()+" WHERE ts <= $1", t).Scan(&last); err != nil {
		return time.Time{}, err
	}
	if last == nil {
		return t, nil
	}
	return last.Add(-pgOffset), nil
}

// commitTime is the SQL for a row's commit time: its transaction's commit
// timestamp when the server tracks them, else its committed_at column.
func commitTime(byCommitTS bool) string {
	if byCommitTS {
		return "pg_xact_commit_timestamp(xmin)"
	}
	return "committed_at"
}
