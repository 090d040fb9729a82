package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/pipeline"
	"github.com/jetsink/jetsink/tests/testenv"
)

type nopMsg struct{}

func (nopMsg) Ack() error                         { return nil }
func (nopMsg) Nak() error                         { return nil }
func (nopMsg) NakWithDelay(time.Duration) error   { return nil }
func (nopMsg) InProgress() error                  { return nil }
func (nopMsg) Term() error                        { return nil }
func (nopMsg) TermWithReason(reason string) error { return nil }

const benchPayload = `{"id":"6f1c2a9e-1b7d-4c1e-9a51-2f0f6a7c9d10","ts":"2026-11-29T20:00:00Z","tags":{"site":"fra1"},"value":42.5}`

// benchRows makes n rows with sequences base+1...; the tuples' stream_seq
// field sits at a fixed offset (seqOffset) so it can be renumbered in place.
func benchRows(n int) []pipeline.Row {
	rs := make([]pipeline.Row, n)
	for i := range rs {
		rs[i] = pipeline.Row{Event: pipeline.Event{Msg: nopMsg{}, Stream: "S", StreamSeq: uint64(i + 1)},
			Tuple: tuple("S", int64(i+1), benchPayload)}
	}
	return rs
}

// seqOffset is where stream_seq's 8 bytes start in a tuple of stream "S".
const seqOffset = 2 + 4 + 1 + 4

func renumber(rs []pipeline.Row, base int) {
	for i := range rs {
		binary.BigEndian.PutUint64(rs[i].Tuple[seqOffset:], uint64(base+i+1))
	}
}

func benchSink(b *testing.B, ctx context.Context, url string, mode Mode, conns int) *Sink {
	b.Helper()
	cfg := DefaultConfig()
	cfg.URL = url
	cfg.Table = fmt.Sprintf("bench_%d", time.Now().UnixNano())
	cfg.CreateTable = true
	cfg.Mode = mode
	cfg.Connections = conns
	s, err := New(ctx, cfg, testCols, &recDL{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

// BenchmarkCopy commits one batch per op: BEGIN; COPY; (INSERT ... ON
// CONFLICT); COMMIT; ack. "tuple" is the sink's path (the pipeline's binary
// tuples streamed verbatim); "pgx-CopyFromRows" is the obvious alternative,
// pgx.Conn.CopyFrom over [][]any values (built once, outside the timer, so
// the alternative is not charged for boxing them).
func BenchmarkCopy(b *testing.B) {
	ctx := context.Background()
	pg := testenv.Postgres(b)
	for _, mode := range []Mode{AtLeastOnce, ExactlyOnce} {
		for _, n := range []int{1000, 5000} {
			b.Run(fmt.Sprintf("mode=%s/rows=%d/path=tuple", mode, n), func(b *testing.B) {
				s := benchSink(b, ctx, pg.URL, mode, 1)
				c := &committer{s: s}
				defer c.closeConn()
				rs := benchRows(n)
				bt := &batch{rows: rs}
				base := 0
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := testenv.ProcessCPU(b)
				for b.Loop() {
					if mode == ExactlyOnce {
						b.StopTimer()
						renumber(rs, base)
						base += n
						b.StartTimer()
					}
					if _, err := c.attempt(ctx, rs); err != nil {
						b.Fatal(err)
					}
					c.settle(bt, 0, n)
				}
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
				b.ReportMetric(float64(testenv.ProcessCPU(b)-cpu0)/float64(n*b.N), "client-cpu-ns/row")
			})
			b.Run(fmt.Sprintf("mode=%s/rows=%d/path=pgx-CopyFromRows", mode, n), func(b *testing.B) {
				s := benchSink(b, ctx, pg.URL, mode, 1)
				conn, err := pgx.Connect(ctx, pg.URL)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close(ctx)
				vals := make([][]any, n)
				for i := range vals {
					vals[i] = []any{"S", int64(i + 1), benchPayload}
				}
				cols := []string{"stream", "stream_seq", "payload"}
				target := s.table
				if mode == ExactlyOnce {
					target = s.staging
					if _, err := conn.Exec(ctx, s.stageSQL); err != nil {
						b.Fatal(err)
					}
				}
				base := 0
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := testenv.ProcessCPU(b)
				for b.Loop() {
					if mode == ExactlyOnce {
						b.StopTimer()
						for i := range vals {
							vals[i][1] = int64(base + i + 1)
						}
						base += n
						b.StartTimer()
					}
					tx, err := conn.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := tx.CopyFrom(ctx, target, cols, pgx.CopyFromRows(vals)); err != nil {
						b.Fatal(err)
					}
					if mode == ExactlyOnce {
						if _, err := tx.Exec(ctx, s.tsql.Load().insert); err != nil {
							b.Fatal(err)
						}
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
				b.ReportMetric(float64(testenv.ProcessCPU(b)-cpu0)/float64(n*b.N), "client-cpu-ns/row")
			})
		}
	}
}

// BenchmarkRun pushes rows through a ring into Run: batching, COPY and acks
// end to end. One op is one row.
func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	pg := testenv.Postgres(b)
	for _, conns := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("connections=%d", conns), func(b *testing.B) {
			s := benchSink(b, ctx, pg.URL, AtLeastOnce, conns)
			src := newSource()
			pool := benchRows(8192)
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := testenv.ProcessCPU(b)
			wg.Go(func() {
				defer src.close()
				left := b.N
				for left > 0 {
					k := min(left, 256)
					off := (b.N - left) % (len(pool) - 256)
					if _, err := src.Ring(0).PushN(ctx, pool[off:off+k]); err != nil {
						return
					}
					left -= k
				}
			})
			if err := s.Run(ctx, src); err != nil {
				b.Fatal(err)
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(float64(testenv.ProcessCPU(b)-cpu0)/float64(b.N), "client-cpu-ns/row")
			st := s.Stats()
			b.ReportMetric(float64(st.Rows)/float64(max(st.Batches, 1)), "rows/batch")
		})
	}
}

// BenchmarkCopyGuard measures what at-least-once's type guard (see
// Sink.buildSQL) costs a batch: the same COPY with and without it, on one
// connection, one batch per op. server-cpu-ns/op is the CPU time of the
// connection's backend (from /proc, in clock ticks: run for seconds).
func BenchmarkCopyGuard(b *testing.B) {
	ctx := context.Background()
	pg := testenv.Postgres(b)
	for _, n := range []int{1, 64, 1000} {
		for _, guard := range []bool{true, false} {
			b.Run(fmt.Sprintf("rows=%d/guard=%v", n, guard), func(b *testing.B) {
				s := benchSink(b, ctx, pg.URL, AtLeastOnce, 1)
				if !guard {
					sql := strings.Split(*s.copySQL.Load(), "; ")[1]
					s.copySQL.Store(&sql)
					// No readTypes writes the guards back, and every read reports
					// the table found, as the one kept did (else the committer
					// would read again before each attempt: committer.unfound).
					s.copyStmts, s.typesStored, s.typesFound = 1, math.MaxUint64, true
				}
				c := &committer{s: s}
				defer c.closeConn()
				rs := benchRows(n)
				bt := &batch{rows: rs}
				if _, err := c.attempt(ctx, rs); err != nil { // connects
					b.Fatal(err)
				}
				pid := c.conn.PgConn().PID()
				b.ResetTimer()
				cpu0 := procCPU(b, pid)
				for b.Loop() {
					if _, err := c.attempt(ctx, rs); err != nil {
						b.Fatal(err)
					}
					c.settle(bt, 0, n)
				}
				b.ReportMetric(float64(procCPU(b, pid)-cpu0)/float64(b.N), "server-cpu-ns/op")
			})
		}
	}
}

// procCPU is the CPU time (user+system) process pid has used so far, from
// /proc/pid/stat (USER_HZ ticks, 100 a second on Linux).
func procCPU(b *testing.B, pid uint32) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// BenchmarkSlowWatch is what watching for a slow batch adds to every
// attempt that ends before slowBatchAfter (nearly all of them).
func BenchmarkSlowWatch(b *testing.B) {
	s := &Sink{}
	b.ReportAllocs()
	for b.Loop() {
		s.watchSlow(1, nil, 1000)()
	}
}
