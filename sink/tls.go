package sink

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// tlsProblem reports ProblemTLSUnverified for cc, postgres.url as pgx
// parsed it, when a connection may reach a host that is not this machine
// in plaintext, or over TLS that does not make sure of the server. It
// reads what pgx made of every setting that bears on it (the URL's or a
// key=value DSN's sslmode, sslrootcert and sslnegotiation, PGSSLMODE and
// the other PG* variables, a service file), not the text: each host's
// tries, in the order pgx makes them (hostsTried), a try's TLSConfig nil
// for plaintext. sslmode=prefer, the default, makes two
// a host, TLS that checks nothing and then plaintext; allow the same the
// other way round (sslrootcert or not: pgx checks no certificate for
// either); require one, TLS that checks nothing unless sslrootcert is set
// (then it is verify-ca); verify-ca without sslrootcert one, TLS that
// takes any certificate a CA of the system signed, for any name (libpq
// would refuse to connect without its root.crt); disable one, plaintext.
// Unix sockets (pgx uses no TLS there) and hosts on this machine
// (onThisMachine) are left out: nothing stands between jetsink and the
// server there.
func tlsProblem(cc *pgconn.Config) (Problem, bool) {
	var names []string
	var plain, plainFirst, unchecked, anyName bool
	for _, h := range hostsTried(cc) {
		if onThisMachine(h.host, h.port) {
			continue
		}
		risky := false
		for j, c := range h.tls {
			switch trustOf(c) {
			case trustPlain:
				plain, risky = true, true
				plainFirst = plainFirst || j == 0 && len(h.tls) > 1
			case trustNothing:
				unchecked, risky = true, true
			case trustAnyName:
				anyName, risky = true, true
			}
		}
		if risky {
			names = append(names, h.name)
		}
	}
	if len(names) == 0 {
		return Problem{}, false
	}
	var how string
	switch {
	case plain && !unchecked && !anyName:
		how = "without TLS (sslmode=disable)"
	case plain && unchecked && plainFirst:
		how = "in plaintext first, and over TLS that checks no certificate if the server wants TLS (sslmode=allow)"
	case plain && unchecked:
		how = "over TLS that checks no certificate, and in plaintext when the server declines TLS (sslmode=prefer, " +
			"pgx's default when none is set)"
	case plain: // not from pgx's parsing: prefer and allow check no certificate, sslrootcert or not
		how = "in plaintext when the server declines TLS"
	case anyName && !unchecked:
		how = "over TLS that takes any certificate a public CA signed, for any name (sslmode=verify-ca without sslrootcert: " +
			"pgx checks the chain against the system's CAs and never the host name, where libpq would refuse to connect)"
	default:
		how = "over TLS that checks no certificate (sslmode=require without sslrootcert)"
	}
	return Problem{Kind: ProblemTLSUnverified, Warning: true,
		Message: fmt.Sprintf("postgres.url connects to %s %s; so whoever is on the way (a man in the middle, or a server "+
			"answering for a spoofed DNS name) can ask for the password in cleartext and get it, and read and change the events",
			strings.Join(names, ","), how),
		Fix: "add sslmode=verify-full and sslrootcert=<the file of the CA that signed the server's certificate> to postgres.url " +
			"(sslrootcert=system for a CA the system trusts); require_auth=scram-sha-256 also keeps the password from " +
			"being sent to a server that asks for it in cleartext. A server on this machine: name it 127.0.0.1, " +
			"localhost or its Unix socket's directory"}, true
}

// trust is what a try's TLS makes sure of.
type trust int

const (
	trustPlain   trust = iota // no TLS (sslmode=disable, prefer's and allow's plaintext try)
	trustNothing              // TLS that checks no certificate (prefer, allow, require)
	trustAnyName              // the chain against the system's CAs, not the name (verify-ca without sslrootcert)
	trustServer               // the chain against sslrootcert (verify-ca, require with it), or the chain and the name (verify-full)
)

// trustOf says what TLS with c, as pgx sets it up, makes sure of; c nil
// is plaintext. For verify-ca pgx skips Go's check, which would also want
// the host name, and checks the chain in VerifyPeerCertificate against
// c.RootCAs, sslrootcert's, or the system's when it is nil.
func trustOf(c *tls.Config) trust {
	switch {
	case c == nil:
		return trustPlain
	case !c.InsecureSkipVerify || c.VerifyConnection != nil:
		return trustServer
	case c.VerifyPeerCertificate == nil:
		return trustNothing
	case c.RootCAs == nil:
		return trustAnyName
	}
	return trustServer
}

// onThisMachine reports whether pgx reaches host (a postgres.url host)
// without the network: a Unix socket's directory, localhost, a loopback
// address, or an unspecified one (0.0.0.0, ::), which Linux connects to
// this machine.
func onThisMachine(host string, port uint16) bool {
	if network, _ := pgconn.NetworkAddress(host, port); network == "unix" {
		return true
	}
	if h := strings.TrimSuffix(host, "."); strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}
