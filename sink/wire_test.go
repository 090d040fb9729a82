package sink

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsink/jetsink/tests/testenv"
)

// The server may write while it reads a COPY (a trigger's NOTICE per row).
// If the sink wrote the whole COPY before reading anything, both sides
// would block in write once the socket buffers are full, and the batch
// would never commit: the answers must be read while the rows go out.
func TestCopyWhileServerSendsNotices(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	pg := testenv.Postgres(t)
	s, _ := newTestSink(t, ctx, pg.URL, func(c *Config) {
		c.Connections, c.Batch.MaxRows, c.Batch.MaxBytes = 1, 5000, 64<<20
	})
	admin := pg.Conn(t)
	tbl := s.table.Sanitize()
	fn := pgx.Identifier{s.cfg.Table + "_notice"}.Sanitize()
	for _, q := range []string{
		"CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE '%', repeat('n', 65536); RETURN NEW; END $$",
		"CREATE TRIGGER noisy BEFORE INSERT ON " + tbl + " FOR EACH ROW EXECUTE FUNCTION " + fn + "()",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pad := strings.Repeat("p", 16<<10)
	rs, ms := rows(1, 1500, func(seq int) string { return fmt.Sprintf(`{"n":%d,"pad":%q}`, seq, pad) })
	src := newSource()
	wait := runSink(t, ctx, s, src)
	src.push(t, ctx, rs)
	src.close()
	waitFor(t, ctx, "the rows to be acked", allAcked(ms))
	if err := wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := count(t, ctx, admin, s.cfg.Table); n != len(rs) {
		t.Fatalf("%d rows, want %d", n, len(rs))
	}
}
