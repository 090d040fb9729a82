package sink

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// timeline is where a primary writes its WAL: its database system
// (initdb's identifier, which every standby made from it shares) and its
// timeline, which each promotion of a standby raises.
type timeline struct {
	system uint64
	tl     uint32
}

// timelines is the newest timeline of the database system that jetsink's
// connections have reached in this run (see Sink.checkTimeline).
type timelines struct {
	mu   sync.Mutex
	seen timeline // zero until the first connection to a primary
}

// splitBrainError: a connection reached a primary on an older timeline of
// the database system than one an earlier connection reached. Only a
// promotion raises a timeline, so this server is a primary that a
// failover left behind, taking writes again: rows stored there would be
// missing from the new primary, and acked.
type splitBrainError struct {
	server     string
	got, newer timeline
}

func (e *splitBrainError) Error() string {
	return fmt.Sprintf("refusing the PostgreSQL server at %s: it takes writes on timeline %d of database system %d, and jetsink "+
		"has been connected to that system on timeline %d, which only a promotion makes: this is the old primary of a failover "+
		"(split brain), and rows stored there would be missing from the new primary; fence it (stop it, or make it a standby "+
		"of the new primary). Batches are retried meanwhile, and their events wait in JetStream",
		e.server, e.got.tl, e.got.system, e.newer.tl)
}

// checkTimeline reads the database system and timeline of conn's server,
// if it takes writes, and refuses (splitBrainError) a server on an older
// timeline of the system than one seen before in this run: after a
// failover, the old primary, first in a failover list, would get every
// new connection if it came back up as a primary. A newer timeline, or
// another database system, is logged and taken as the one to follow. A
// server that cannot tell (the functions refused or missing: a
// PostgreSQL-compatible one) is not checked; only an error that closed
// conn, or ctx's end, is returned as such. The check cannot see a
// failover that came before jetsink started.
func (s *Sink) checkTimeline(ctx context.Context, conn *pgx.Conn) error {
	var system int64
	var walFile *string
	err := conn.QueryRow(ctx, `SELECT system_identifier, CASE WHEN pg_is_in_recovery() THEN NULL
		ELSE pg_walfile_name(pg_current_wal_lsn()) END FROM pg_control_system()`).Scan(&system, &walFile)
	if err != nil {
		if conn.IsClosed() || ctx.Err() != nil {
			return fmt.Errorf("read the server's timeline on %s: %w", s.where, err)
		}
		if s.firstSeen("timeline " + err.Error()) {
			s.log.Info("cannot read the server's timeline, so an old primary that a failover left behind is not told apart", "err", err)
		}
		return nil
	}
	if walFile == nil || len(*walFile) < 8 {
		return nil // a standby: it takes no writes (every batch fails with 25006)
	}
	tl, err := strconv.ParseUint((*walFile)[:8], 16, 32)
	if err != nil {
		return nil
	}
	got := timeline{system: uint64(system), tl: uint32(tl)}
	server := s.where
	if nc := conn.PgConn().Conn(); nc != nil {
		server = nc.RemoteAddr().String()
	}
	s.timelines.mu.Lock()
	defer s.timelines.mu.Unlock()
	seen := s.timelines.seen
	switch {
	case seen.system != got.system:
		if seen.system != 0 && s.firstSeen(fmt.Sprintf("system %d after %d", got.system, seen.system)) {
			s.log.Warn("connected to another PostgreSQL database system than before: the rows stored before are not there",
				"server", server, "system", got.system, "before", seen.system)
		}
		s.timelines.seen = got
	case got.tl > seen.tl:
		s.log.Info("PostgreSQL is on a newer timeline: a standby was promoted", "server", server, "timeline", got.tl, "before", seen.tl)
		s.timelines.seen = got
	case got.tl < seen.tl:
		return &splitBrainError{server: server, got: got, newer: seen}
	}
	return nil
}
