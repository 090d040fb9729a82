package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BaselineConfig says where the baseline consumer reads and writes.
type BaselineConfig struct {
	NATSURL string
	// NATSOptions are the connection's credentials and TLS settings.
	NATSOptions []nats.Option
	Stream      string
	Consumer    string // durable name
	DatabaseURL string
	Table       string
	BatchRows   int           // default 1000
	BatchDelay  time.Duration // default 50ms
	// Log receives the start-up line (slog text format) that says what
	// the baseline runs with, as jetsink's does (RanWith); nil: none.
	Log io.Writer
}

// telemetry is the event as encoding/json decodes it.
type telemetry struct {
	ID     string    `json:"id"`
	TS     time.Time `json:"ts"`
	Device string    `json:"device"`
	Kind   string    `json:"kind"`
	Value  float64   `json:"value"`
	Seq    int64     `json:"seq"`
	Tags   struct {
		Site string `json:"site"`
	} `json:"tags"`
}

// baselineColumns are the table's mapped columns, in COPY order.
var baselineColumns = []string{"id", "ts", "device", "kind", "value", "seq", "site", "body", "stream", "stream_seq", "published_at"}

// RunBaseline is the straightforward consumer: one goroutine, Consume's
// callback feeding a channel, a batch of BatchRows messages or BatchDelay,
// BEGIN; CopyFrom(CopyFromRows); COMMIT; then Ack each message. It runs
// until ctx is cancelled, finishing the batch in hand, and returns nil then;
// other errors are NATS's or PostgreSQL's, wrapped with the operation.
func RunBaseline(ctx context.Context, cfg BaselineConfig) error {
	if cfg.BatchRows <= 0 {
		cfg.BatchRows = 1000
	}
	if cfg.BatchDelay <= 0 {
		cfg.BatchDelay = 50 * time.Millisecond
	}
	nc, err := nats.Connect(cfg.NATSURL, append([]nats.Option{nats.Name("jetsink-bench-baseline")}, cfg.NATSOptions...)...)
	if err != nil {
		return fmt.Errorf("baseline: connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 10 * cfg.BatchRows,
	})
	if err != nil {
		return fmt.Errorf("baseline: create consumer: %w", err)
	}
	db, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("baseline: connect to PostgreSQL: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))

	if cfg.Log != nil {
		// One goroutine and one connection, by design; GOMAXPROCS is the
		// runtime's (a cgroup's CPU quota lowers it), and the bench reads
		// it here rather than working it out.
		slog.New(slog.NewTextHandler(cfg.Log, nil)).Info(baselineStartMsg, "gomaxprocs", runtime.GOMAXPROCS(0),
			"workers", 1, "connections", 1, "mode", "at-least-once")
	}
	msgs := make(chan jetstream.Msg, cfg.BatchRows)
	cc, err := cons.Consume(func(m jetstream.Msg) { msgs <- m })
	if err != nil {
		return fmt.Errorf("baseline: consume: %w", err)
	}
	// Stop the subscription, reading the channel meanwhile so that a callback
	// blocked on it can return; what it held is redelivered later.
	defer func() {
		cc.Stop()
		for {
			select {
			case <-msgs:
			case <-cc.Closed():
				return
			}
		}
	}()

	table := pgx.Identifier{cfg.Table}
	batch := make([]jetstream.Msg, 0, cfg.BatchRows)
	rows := make([][]any, 0, cfg.BatchRows)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		rows = rows[:0]
		for _, m := range batch {
			var ev telemetry
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				return fmt.Errorf("baseline: decode: %w", err)
			}
			id, err := uuid.Parse(ev.ID)
			if err != nil {
				return fmt.Errorf("baseline: decode id: %w", err)
			}
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("baseline: metadata: %w", err)
			}
			rows = append(rows, []any{[16]byte(id), ev.TS, ev.Device, ev.Kind, ev.Value, ev.Seq, ev.Tags.Site,
				json.RawMessage(m.Data()), md.Stream, int64(md.Sequence.Stream), md.Timestamp})
		}
		// The final batch is written even when ctx is already cancelled.
		wctx := context.WithoutCancel(ctx)
		err := pgx.BeginFunc(wctx, db, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(wctx, table, baselineColumns, pgx.CopyFromRows(rows))
			return err
		})
		if err != nil {
			return fmt.Errorf("baseline: copy batch: %w", err)
		}
		for _, m := range batch {
			if err := m.Ack(); err != nil {
				return fmt.Errorf("baseline: ack: %w", err)
			}
		}
		batch = batch[:0]
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return flush()
		case m := <-msgs:
			if len(batch) == 0 {
				timer.Reset(cfg.BatchDelay)
			}
			batch = append(batch, m)
			if len(batch) < cfg.BatchRows {
				continue
			}
			timer.Stop()
		case <-timer.C:
		}
		if err := flush(); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
	}
}
