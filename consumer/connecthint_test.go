package consumer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A failed connect names what to check by its cause: before, every
// failure, a refused password or an untrusted CA alike, asked whether a
// nats-server listened there at all. That question stays for a dial
// nothing answered.
func TestConnectErrorHintsByCause(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca := newTestCA(t)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{ca.issue(t, false)}, MinVersion: tls.VersionTLS12}
	mTLS := serverTLS.Clone()
	mTLS.ClientAuth, mTLS.ClientCAs = tls.RequireAndVerifyClientCert, ca.pool
	nothing := func() string { // a port nothing listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		return "nats://" + addr
	}
	for _, tc := range []struct {
		name      string
		opts      func(*server.Options) // nil: no server
		cfg       func(*Config)
		want, not string
	}{
		{"a wrong password", func(o *server.Options) {
			o.Users = []*server.User{{Username: "jetsink", Password: "right"}}
		}, func(c *Config) { c.User, c.Password = "jetsink", "wrong" }, "nats.password", "listening there"},
		// nats.go refuses to go on when the server asks for no NKey:
		// the server answered, so not "listening there?".
		{"an NKey for a server without NKey users", func(o *server.Options) {
			o.Users = []*server.User{{Username: "jetsink", Password: "right"}}
		}, func(c *Config) { c.NKeyFile = testNKeyFile(t) }, "has no NKey users", "listening there"},
		{"a CA that did not sign the server's certificate", func(o *server.Options) {
			o.TLSConfig, o.TLS = serverTLS, true
		}, func(c *Config) { c.TLS.CAFile = testenv.CAFile(t) }, "nats.tls.ca_file", "listening there"},
		{"no client certificate where the server wants one", func(o *server.Options) {
			o.TLSConfig, o.TLS, o.TLSVerify = mTLS, true, true
		}, func(c *Config) { c.TLS.CAFile = ca.file }, "nats.tls.cert_file", "refused jetsink's TLS client certificate"},
		{"TLS asked of a server without it", func(*server.Options) {},
			func(c *Config) { c.TLS.CAFile = ca.file }, "nats.tls", "listening there"},
		{"nothing listening", nil, func(c *Config) { c.URL = nothing() }, "listening there", "nats.password"},
		// docker-proxy while the server is not up yet, or a load
		// balancer with no ready backend: a bare EOF before any INFO.
		{"a listener that accepts and closes", nil, func(c *Config) { c.URL = acceptAndClose(t) }, "listening there", "nats.password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.opts != nil {
				opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
					JetStream: true, StoreDir: t.TempDir(), ServerName: "hint"}
				tc.opts(opts)
				cfg.URL = startServer(t, opts).ClientURL()
			}
			name := uniqueName(t)
			cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
			cfg.DeadLetterSubject = "dlq." + name
			tc.cfg(&cfg)
			c, err := New(ctx, cfg, testLogger(t, nil))
			if err == nil {
				_ = c.Close(ctx)
				t.Fatal("New connected")
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, tc.not) {
				t.Fatalf("New: %v\nwant it to name %q, and not %q", err, tc.want, tc.not)
			}
			if _, err := Check(ctx, cfg, testLogger(t, nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check: %v\nwant it to name %q", err, tc.want)
			}
		})
	}
}

// testNKeyFile is a file holding a new user NKey's seed.
func testNKeyFile(t *testing.T) string {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(p, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The causes no test server gives at will: a server with TLS handshake
// first ends the connection before its INFO (EOF); one that refuses the
// client certificate under TLS 1.3 closes it after the handshake.
func TestConnectHint(t *testing.T) {
	for _, tc := range []struct {
		err        error
		clientCert bool
		want       string
	}{
		{io.EOF, false, hintClosed},
		{fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, io.EOF), true, hintClientCrt},
		{fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, io.EOF), false, hintTLSClosed},
		{&net.OpError{Op: "remote error", Err: testAlert(116)}, false, hintNoClientCrt},
		{&net.OpError{Op: "remote error", Err: testAlert(42)}, true, hintClientCrt},
		{nats.ErrNoServers, false, hintListening},
		{nats.ErrAuthExpired, false, hintAuth},
		{&net.OpError{Op: "dial", Err: errors.New("no route to host")}, false, hintListening},
		{&net.DNSError{Err: "no such host", Name: "nats.example", IsNotFound: true}, false, hintListening},
		{fmt.Errorf("%w: %w", nats.ErrTLS, &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), false, hintCA},
	} {
		if got := connectHint(tc.err, tc.clientCert); got != tc.want {
			t.Errorf("connectHint(%v, %v) = %q, want %q", tc.err, tc.clientCert, got, tc.want)
		}
	}
	if !strings.Contains(hintClosed, `"300ms"`) || !strings.Contains(hintClosed, "listening there") {
		t.Errorf("the hint for a bare EOF does not give both causes: %s", hintClosed)
	}
}

// testAlert stands for crypto/tls's unexported alert type, a uint8.
type testAlert uint8

func (a testAlert) Error() string { return fmt.Sprintf("tls: alert(%d)", uint8(a)) }

// acceptAndClose is the URL of a plain TCP listener that accepts each
// connection and closes it at once, saying nothing.
func acceptAndClose(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	return "nats://" + l.Addr().String()
}

// testCA is a throwaway CA: its pool, its certificate's PEM file, and
// what it issues for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	file string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hint CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pool: pool, file: file}
}

// issue is a certificate for 127.0.0.1 and ips, for a server, or for a
// client.
func (ca *testCA) issue(t *testing.T, client bool, ips ...net.IP) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: append([]net.IP{net.ParseIP("127.0.0.1")}, ips...), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A connection that is not TLS to an address that is not loopback, with
// credentials sent, is warned of by check and logged by New: a nats://
// URL uses TLS only when the server asks, and the password went in the
// clear with nothing said. Not for TLS, a loopback address, no
// credentials, or user info in another server's URL than the one
// connected to (nats.go sends each URL's own). The servers listen on
// 127.0.0.1, which the cases "elsewhere" have judged not loopback
// (offLoopback replaced), so that no other interface is needed; the
// loopback cases go through the real judgement.
func TestClearTextWarned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca := newTestCA(t)
	start := func(users bool, tlsOn bool) int {
		opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
			JetStream: true, StoreDir: t.TempDir(), ServerName: "clear"}
		if users {
			opts.Users = []*server.User{{Username: "jetsink", Password: "right"}}
		}
		if tlsOn {
			opts.TLSConfig = &tls.Config{Certificates: []tls.Certificate{ca.issue(t, false)}, MinVersion: tls.VersionTLS12}
			opts.TLS = true
		}
		return startServer(t, opts).Addr().(*net.TCPAddr).Port
	}
	auth, open, tlsAuth := start(true, false), start(false, false), start(true, true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port // nothing listens there
	_ = l.Close()
	at := func(host string, port int) string { return fmt.Sprintf("nats://%s:%d", host, port) }
	password := func(c *Config) { c.User, c.Password = "jetsink", "right" }
	const warning = ", an address that is not loopback) is not TLS: "
	for _, tc := range []struct {
		name      string
		elsewhere bool // offLoopback judges every address not loopback
		url       string
		cfg       func(*Config)
		want      string // "" for no warning
	}{
		{"a password elsewhere", true, at("127.0.0.1", auth), password, "nats.user and nats.password and the events cross the network in the clear"},
		{"user info in the URL", true, fmt.Sprintf("nats://jetsink:right@127.0.0.1:%d", auth), func(*Config) {}, "the user info (a user and password, or a token) in nats.url"},
		{"user info of another server", true, fmt.Sprintf("nats://jetsink:right@127.0.0.1:%d,nats://127.0.0.1:%d", closed, open), func(*Config) {}, ""},
		{"a password on loopback", false, at("127.0.0.1", auth), password, ""},
		{"a password on localhost", false, at("localhost", auth), password, ""},
		{"no credentials", true, at("127.0.0.1", open), func(*Config) {}, ""},
		{"a password over TLS", true, at("127.0.0.1", tlsAuth), func(c *Config) { password(c); c.TLS.CAFile = ca.file }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.elsewhere {
				t.Cleanup(func() { offLoopback = notLoopback })
				offLoopback = func(string) bool { return true }
			}
			cfg := DefaultConfig()
			cfg.URL = tc.url
			name := uniqueName(t)
			cfg.Stream, cfg.Subjects, cfg.Consumer = name, []string{"in." + name + ".>"}, "c_"+name
			cfg.DeadLetterSubject, cfg.CreateStream = "dlq."+name, true
			tc.cfg(&cfg)
			w := checkText(t, ctx, cfg, false)
			_, logged := newLoggedConsumer(t, ctx, cfg)
			for _, out := range []struct{ by, text string }{{"check", w}, {"run", logged.String()}} {
				if tc.want == "" && strings.Contains(out.text, warning) {
					t.Errorf("%s warns of a connection in the clear:\n%s", out.by, out.text)
				}
				if tc.want != "" && (!strings.Contains(out.text, warning+tc.want) || !strings.Contains(out.text, "tls://") || !strings.Contains(out.text, "sidecar")) {
					t.Errorf("%s does not warn %q:\n%s", out.by, tc.want, out.text)
				}
				if strings.Contains(out.text, "right") {
					t.Errorf("%s shows the password:\n%s", out.by, out.text)
				}
			}
		})
	}
}

// An address is judged loopback or not as nats.go reached it: IPv4 and
// IPv6, an IPv4 one mapped into IPv6, and an IPv6 one with a zone, which
// net.ParseIP refuses (a link-local server went unwarned).
func TestNotLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": false, "127.3.2.1": false, "::1": false, "::ffff:127.0.0.1": false, "::1%lo": false,
		"10.0.0.5": true, "192.168.1.20": true, "172.17.0.1": true, "2001:db8::1": true, "::ffff:10.0.0.5": true,
		"fe80::1%eth0": true, "fe80::1": true,
		"localhost": false, "": false, // no address: nothing to judge
	} {
		if got := notLoopback(host); got != want {
			t.Errorf("notLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

// The credentials a connection in the clear would carry are named by the
// setting that gives them.
func TestSentCredentials(t *testing.T) {
	for _, tc := range []struct {
		cfg       Config
		connected string
		want      string
	}{
		{Config{URL: "nats://h:4222"}, "nats://h:4222", ""},
		{Config{URL: "nats://h:4222", User: "u", Password: "p"}, "nats://h:4222", "nats.user and nats.password"},
		{Config{URL: "nats://h:4222", CredsFile: "/c"}, "nats://h:4222", "the JWT of nats.creds_file and its signature"},
		{Config{URL: "nats://h:4222", NKeyFile: "/n"}, "nats://h:4222", "the NKey of nats.nkey_file and its signature"},
		{Config{URL: "nats://a:4222,nats://TOKEN@b:4222"}, "nats://TOKEN@b:4222", "the user info (a user and password, or a token) in nats.url"},
		// Connected to a, which nats.go sends no user info: b's is not sent.
		{Config{URL: "nats://a:4222,nats://TOKEN@b:4222"}, "nats://a:4222", ""},
		// A server learnt from a's INFO gets a's user info from nats.go.
		{Config{URL: "nats://u:p@a:4222"}, "nats://u:p@10.0.0.7:4222", "the user info (a user and password, or a token) in nats.url"},
		{Config{URL: "nats://u:p@a:4222"}, "", ""}, // not connected
	} {
		if got := sentCredentials(&tc.cfg, tc.connected); got != tc.want {
			t.Errorf("sentCredentials(%+v, %q) = %q, want %q", tc.cfg, tc.connected, got, tc.want)
		}
	}
}
