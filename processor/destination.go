package processor

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Destination names where a jetsink writes, for consumer.Config's
// Destination (recorded in the durable's metadata, where anyone who may
// read the consumer's info reads it): the PostgreSQL server's hosts and
// ports, sorted (a URL naming a cluster's hosts in another order names the
// same destination), its database, and postgres.table as configured
// ("db1:5432/app public.events"); never the user or password. "" for a
// connection string pgx does not read (validation refuses it first):
// nothing is then recorded or compared. New sets it where the config
// leaves it empty.
func Destination(conn, table string) string {
	pc, err := pgconn.ParseConfig(conn)
	if err != nil {
		return ""
	}
	hosts := PostgresHosts(pc)
	slices.Sort(hosts)
	return strings.Join(hosts, ",") + "/" + pc.Database + " " + table
}

// PostgresHosts are pc's hosts and ports ("host:port"), in pgx's order, each
// once (with sslmode=prefer pgx lists each host twice). A host holding an
// @ (a raw @ in the password, which validation refuses first) is cut after
// it.
func PostgresHosts(pc *pgconn.Config) []string {
	hostPort := func(host string, port uint16) string {
		if i := strings.LastIndexByte(host, '@'); i >= 0 {
			host = host[i+1:]
		}
		return net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	hosts := []string{hostPort(pc.Host, pc.Port)}
	for _, f := range pc.Fallbacks {
		if h := hostPort(f.Host, f.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}
