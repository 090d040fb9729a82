package sink

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// timeline is where a primary writes its WAL: its database system
// (initdb's identifier, which every standby made from it shares) and its
// timeline, which each promotion of a standby raises.
type timeline struct {
	system uint64
	tl     uint32
}

// older reports whether t is an earlier timeline of the same database
// system as newer: a primary on it is the old primary of a failover.
func (t timeline) older(newer timeline) bool { return t.system == newer.system && t.tl < newer.tl }

// timelineKey holds a connection's timeline in its pgconn.PgConn's
// CustomData, where validateTimeline puts it.
const timelineKey = "jetsink.timeline"

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
	return fmt.Sprintf("refused the PostgreSQL server at %s: it takes writes on timeline %d of database system %d, and jetsink "+
		"has been connected to that system on timeline %d, which only a promotion makes: this is the old primary of a failover "+
		"(split brain), and rows stored there would be missing from the new primary. Fence it (stop it, or make it a standby "+
		"of the new primary); if it is meant to be the primary again (a failback, a restored backup), restart jetsink",
		e.server, e.got.tl, e.got.system, e.newer.tl)
}

// validateTimeline is part of every connection's ValidateConnect (see
// New): it reads the database system and timeline of the server, if it
// takes writes, keeps it in the connection's CustomData, and refuses
// (splitBrainError, logged at Error) a server on an older timeline of the
// system than the newest one seen in this run. After a failover, the old
// primary, back up as one and first in a failover list, would get every
// new connection; refused, pgx tries the next host. A newer timeline, or
// another database system, is logged and followed from then on. A server
// that cannot tell (the functions refused or missing: a PostgreSQL-
// compatible one) is not checked. The check cannot see a failover that
// came before jetsink started.
func (s *Sink) validateTimeline(ctx context.Context, pc *pgconn.PgConn) error {
	ctx, cancel := context.WithTimeout(ctx, readTypesTimeout) // the connect's own timeout may be none
	defer cancel()
	res, err := pc.Exec(ctx, `SELECT system_identifier, CASE WHEN pg_is_in_recovery() THEN NULL
		ELSE pg_walfile_name(pg_current_wal_lsn()) END FROM pg_control_system()`).ReadAll()
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2) {
		err = fmt.Errorf("unexpected answer %v", res)
	}
	if err != nil {
		if pc.IsClosed() || ctx.Err() != nil {
			return fmt.Errorf("read the server's timeline: %w", err)
		}
		if s.firstSeen("timeline " + err.Error()) {
			s.log.Info("cannot read the server's timeline, so an old primary that a failover left behind is not told apart", "err", err)
		}
		return nil
	}
	row := res[0].Rows[0]
	if len(row[1]) < 8 {
		return nil // a standby: it takes no writes
	}
	system, err1 := strconv.ParseInt(string(row[0]), 10, 64)
	tl, err2 := strconv.ParseUint(string(row[1][:8]), 16, 32)
	if err1 != nil || err2 != nil {
		return nil
	}
	got := timeline{system: uint64(system), tl: uint32(tl)}
	server := pc.Conn().RemoteAddr().String()
	for {
		seen := s.timelines.Load()
		if seen != nil && got.older(*seen) {
			err := &splitBrainError{server: server, got: got, newer: *seen}
			if s.firstSeen(fmt.Sprintf("split brain %s %+v", server, got)) {
				s.log.Error("an old primary takes connections; refused: fence it", "err", err)
			}
			return err
		}
		if seen == nil || *seen != got {
			// The first, a newer timeline, or another database system.
			if !s.timelines.CompareAndSwap(seen, &got) {
				continue // another connection's came first: compare with it
			}
			switch {
			case seen == nil:
			case seen.system != got.system:
				if s.firstSeen(fmt.Sprintf("system %d after %d", got.system, seen.system)) {
					s.log.Warn("connected to another PostgreSQL database system than before: the rows stored before are not there",
						"server", server, "system", got.system, "before", seen.system)
				}
			default:
				s.log.Info("PostgreSQL is on a newer timeline: a standby was promoted", "server", server, "timeline", got.tl, "before", seen.tl)
			}
		}
		pc.CustomData()[timelineKey] = got
		return nil
	}
}

// behind reports whether conn reached a primary on a timeline older than
// the newest one jetsink's connections have seen since: a connection made
// before a failover to a primary that is still up (a partition healed)
// would go on committing there. The committer closes it, and its next
// connect is validated (validateTimeline).
func (s *Sink) behind(pc *pgconn.PgConn) bool {
	t, ok := pc.CustomData()[timelineKey].(timeline)
	if !ok {
		return false
	}
	seen := s.timelines.Load()
	return seen != nil && t.older(*seen)
}
