package sink

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsink/jetsink/pipeline"
)

// copyReader streams header, tuples and trailer exactly, whatever the size
// of the reads.
func TestCopyReader(t *testing.T) {
	rs, _ := rows(1, 7, nil)
	rs[3].Tuple = tuple("S", 4, string(bytes.Repeat([]byte("x"), 300)))
	want := append([]byte(nil), copyHeader...)
	for _, r := range rs {
		want = append(want, r.Tuple...)
	}
	want = append(want, copyTrailer...)
	for _, size := range []int{1, 2, 3, 7, 19, 64, 65536} {
		rd := &copyReader{rows: rs}
		var got []byte
		buf := make([]byte, size)
		for {
			n, err := rd.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read size %d: stream differs", size)
		}
	}
	got, _ := io.ReadAll(&copyReader{})
	if !bytes.Equal(got, append(append([]byte(nil), copyHeader...), copyTrailer...)) {
		t.Fatalf("empty batch: %q", got)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want class
	}{
		{&pgconn.PgError{Code: "23514"}, classData},
		{&pgconn.PgError{Code: "22001"}, classData},
		{fmt.Errorf("copy: %w", &pgconn.PgError{Code: "23505"}), classData},
		{&pgconn.PgError{Code: "22P03"}, classConfig},
		{&pgconn.PgError{Code: "40001"}, classTransient},
		{&pgconn.PgError{Code: "40P01"}, classTransient},
		{&pgconn.PgError{Code: "57P01"}, classTransient},
		{&pgconn.PgError{Code: "53300"}, classTransient},
		{&pgconn.PgError{Code: "08006"}, classTransient},
		{&pgconn.PgError{Code: "55P03"}, classTransient},
		{&pgconn.PgError{Code: "42P01"}, classConfig},
		{&pgconn.PgError{Code: "42501"}, classConfig},
		{&pgconn.PgError{Code: "28P01"}, classConfig},
		{fmt.Errorf("begin: %w", pgconn.ErrConnClosed), classTransient},
		{fmt.Errorf("copy: %w", io.ErrUnexpectedEOF), classTransient},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, classTransient},
		{errors.New("something else"), classConfig},
	}
	for _, tc := range cases {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if outcomeUnknown(&pgconn.PgError{Code: "40001"}) || !outcomeUnknown(io.ErrUnexpectedEOF) {
		t.Error("outcomeUnknown")
	}
}

func TestBackoffBounds(t *testing.T) {
	b := backoff{initial: 100, max: 1000}
	for i := range 20 {
		d := b.next()
		if d < 50 || d > 1000 {
			t.Fatalf("step %d: %d out of bounds", i, d)
		}
	}
}

// Sanitize then ParseTable gives the same parts back, and ParseTable never
// panics.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{"events", "a.b", `"a.b".c`, `x"; drop table y; --`, `"a""b"`, "", ".", `"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseTable(s)
		if err != nil {
			return
		}
		again, err := ParseTable(id.Sanitize())
		if err != nil || len(again) != len(id) {
			t.Fatalf("%q -> %q -> %q, %v", s, id.Sanitize(), again, err)
		}
		for i := range id {
			if again[i] != id[i] {
				t.Fatalf("%q -> %q -> %q", s, id.Sanitize(), again)
			}
		}
	})
}

// The batcher's cut rules without a database: fill moves rows from the
// carry and stops exactly at max_rows and max_bytes.
func TestFillLimits(t *testing.T) {
	rs, _ := rows(1, 10, nil)
	size := len(rs[0].Tuple)
	for _, tc := range []struct {
		cfg  BatchConfig
		want int
	}{
		{BatchConfig{MaxRows: 4, MaxBytes: 1 << 20}, 4},
		{BatchConfig{MaxRows: 100, MaxBytes: 3 * size}, 3},
		{BatchConfig{MaxRows: 100, MaxBytes: 3*size - 1}, 2},
		{BatchConfig{MaxRows: 100, MaxBytes: 1}, 1}, // a row larger than max_bytes goes alone
		{BatchConfig{MaxRows: 100, MaxBytes: 1 << 20}, 10},
	} {
		r := &run{carry: &batch{rows: make([]pipeline.Row, 0, carrySize)}}
		r.carry.rows = append(r.carry.rows, rs...)
		b := &batch{rows: make([]pipeline.Row, 0, tc.cfg.MaxRows)}
		full := r.fill(b, &tc.cfg)
		if len(b.rows) != tc.want || full != (tc.want < 10) || r.carry.lo != tc.want {
			t.Errorf("%+v: %d rows, full %v, carry at %d; want %d", tc.cfg, len(b.rows), full, r.carry.lo, tc.want)
		}
	}
}
