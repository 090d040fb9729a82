package wire

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// startServer runs an in-process server on a random loopback port with
// the options adjust sets, JetStream in a temporary directory.
func startServer(t *testing.T, adjust func(*server.Options)) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), ServerName: "wire-auth"}
	adjust(o)
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// jetStreamAt is a nats.go JetStream context on a connection to url,
// closed when the test ends.
func jetStreamAt(t *testing.T, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func serverURL(s *server.Server, scheme, userinfo string) string {
	return fmt.Sprintf("%s://%s%s", scheme, userinfo, s.Addr().String())
}

// dialFlush dials, proves the connection works with a round trip, closes.
func dialFlush(ctx context.Context, o Options) error {
	c, err := Dial(ctx, o)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Flush(ctx)
}

func TestAuthUserPassword(t *testing.T) {
	const secret = "s3cr3t-Passw0rd"
	s := startServer(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "jetsink", Password: secret}}
	})
	ctx := testCtx(t, 30*time.Second)
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), User: "jetsink", Password: secret}); err != nil {
		t.Fatalf("user/password: %v", err)
	}
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", "jetsink:"+secret+"@")}); err != nil {
		t.Fatalf("user/password in URL: %v", err)
	}
	// As in nats.go, the URL's user information wins over the options'.
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", "jetsink:"+secret+"@"), User: "other", Password: "wrong"}); err != nil {
		t.Fatalf("user/password in URL and options: %v", err)
	}
	for _, o := range []Options{
		{URL: serverURL(s, "nats", ""), User: "jetsink", Password: "wrong-" + secret},
		{URL: serverURL(s, "nats", "jetsink:wrong-"+secret+"@")},
		{URL: serverURL(s, "nats", "")},
	} {
		err := dialFlush(ctx, o)
		if !errors.Is(err, ErrAuthorization) {
			t.Errorf("wrong credentials: %v, want ErrAuthorization", err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error quotes the password: %v", err)
		}
	}
	if _, err := Dial(ctx, Options{URL: "nats://jetsink:" + secret + "@bad host:1"}); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("bad URL: %v", err)
	}
}

func TestAuthNKey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	s := startServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 30*time.Second)
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), NKeyFile: seedFile}); err != nil {
		t.Fatalf("nkey: %v", err)
	}
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	otherFile := filepath.Join(dir, "other.nk")
	if err := os.WriteFile(otherFile, otherSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), NKeyFile: otherFile}); !errors.Is(err, ErrAuthorization) {
		t.Errorf("unknown nkey: %v, want ErrAuthorization", err)
	}
	garbage := filepath.Join(dir, "garbage.nk")
	if err := os.WriteFile(garbage, []byte("SUNOTAVALIDSEED"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), NKeyFile: garbage})
	if !errors.Is(err, ErrInvalidOptions) || strings.Contains(err.Error(), "SUNOTAVALIDSEED") {
		t.Errorf("bad seed file: %v", err)
	}
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), NKeyFile: filepath.Join(dir, "missing")}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("missing seed file: %v", err)
	}
}

func TestAuthCredsFile(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	useed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(o *server.Options) {
		o.TrustedKeys = []string{opub}
		o.AccountResolver = resolver
		o.JetStream = false // the account has no JetStream limits; auth is what is tested
	})
	dir := t.TempDir()
	file := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(file, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 30*time.Second)
	if err := dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), CredsFile: file}); err != nil {
		t.Fatalf("creds: %v", err)
	}
	// A user signed by an account the server does not know is refused.
	akp2, _ := nkeys.CreateAccount()
	ujwt2, _ := jwt.NewUserClaims(upub).Encode(akp2)
	creds2, _ := jwt.FormatUserConfig(ujwt2, useed)
	file2 := filepath.Join(dir, "stranger.creds")
	if err := os.WriteFile(file2, creds2, 0o600); err != nil {
		t.Fatal(err)
	}
	err = dialFlush(ctx, Options{URL: serverURL(s, "nats", ""), CredsFile: file2})
	if !errors.Is(err, ErrAuthorization) || strings.Contains(err.Error(), string(useed)) {
		t.Errorf("unknown account: %v, want ErrAuthorization", err)
	}
}

// testPKI makes a throwaway CA and a server certificate for 127.0.0.1 and
// localhost.
func testPKI(t *testing.T) (serverCfg *tls.Config, roots *x509.CertPool) {
	t.Helper()
	return testPKIFor(t, net.ParseIP("127.0.0.1"))
}

// testPKIFor is testPKI with a certificate for localhost and the given
// addresses only.
func testPKIFor(t *testing.T, ips ...net.IP) (serverCfg *tls.Config, roots *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "wire test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(ca)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, roots
}

func TestTLS(t *testing.T) {
	srvCfg, roots := testPKI(t)
	s := startServer(t, func(o *server.Options) {
		o.TLSConfig = srvCfg
		o.TLS = true
		o.TLSTimeout = 5
	})
	ctx := testCtx(t, 30*time.Second)
	// Messages flow over TLS: publish with nats.go, consume with wire.
	js := jetStreamAt(t, serverURL(s, "tls", ""), nats.Secure(&tls.Config{RootCAs: roots}))
	const n = 50
	preload(t, ctx, js, "TLS", n, 3, jetstream.ConsumerConfig{AckWait: time.Minute})
	c, err := Dial(ctx, Options{URL: serverURL(s, "nats", ""), TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer c.Close()
	got := make(chan *Msg, n)
	sub, err := c.Consume(PullOptions{Stream: "TLS", Consumer: "C"}, func(m *Msg) { got <- m }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		m := nextMsg(t, got, 10*time.Second)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	sub.Drain()
	waitClosed(t, sub, 5*time.Second)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Without the CA the server's certificate is refused; a server that
	// requires TLS gets it even from a nats:// URL without Options.TLS.
	err = dialFlush(ctx, Options{URL: serverURL(s, "nats", "")})
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("dial without the CA: %v, want x509.UnknownAuthorityError", err)
	}
	// TLS wanted from a server that does not offer it.
	plain := startServer(t, func(*server.Options) {})
	if err := dialFlush(ctx, Options{URL: serverURL(plain, "tls", ""), TLS: &tls.Config{RootCAs: roots}}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("TLS to a plain server: %v, want ErrInvalidOptions", err)
	}
}

// A server dialled by IP whose certificate names only its host name (a
// server another one gave out, as nats.go meets them): ServerName says
// what to check the certificate against, whether or not Options.TLS is set.
func TestTLSServerName(t *testing.T) {
	srvCfg, roots := testPKIFor(t) // localhost only
	s := startServer(t, func(o *server.Options) {
		o.TLSConfig = srvCfg
		o.TLS = true
		o.TLSTimeout = 5
	})
	ctx := testCtx(t, 30*time.Second)
	url := serverURL(s, "tls", "") // 127.0.0.1
	var hostErr x509.HostnameError
	if err := dialFlush(ctx, Options{URL: url, TLS: &tls.Config{RootCAs: roots}}); !errors.As(err, &hostErr) {
		t.Fatalf("dial by IP without ServerName: %v, want x509.HostnameError", err)
	}
	if err := dialFlush(ctx, Options{URL: url, TLS: &tls.Config{RootCAs: roots}, ServerName: "localhost"}); err != nil {
		t.Errorf("dial by IP with ServerName localhost: %v", err)
	}
	// TLS.ServerName wins.
	if err := dialFlush(ctx, Options{URL: url, TLS: &tls.Config{RootCAs: roots, ServerName: "elsewhere"}, ServerName: "localhost"}); !errors.As(err, &hostErr) {
		t.Errorf("TLS.ServerName elsewhere: %v, want x509.HostnameError", err)
	}
}

// The CONNECT that Dial sends for the URL's user information matches
// nats.go's: it replaces the options' user, password and nkey; user@ is a
// token and user:@ a user with an empty password.
func TestURLUserInfoConnect(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		userinfo string
		o        Options
		want     connectInfo
	}{
		{"alice:pw@", Options{User: "bob", Password: "x", NKeyFile: seedFile}, connectInfo{User: "alice", Pass: "pw"}},
		{"tok@", Options{User: "bob", Password: "x"}, connectInfo{Token: "tok"}},
		{"alice:@", Options{}, connectInfo{User: "alice"}},
		{"", Options{User: "bob", Password: "x"}, connectInfo{User: "bob", Pass: "x"}},
		// Without a URL's: a user without a password is a user, as
		// nats.go's UserInfo sends it (nats.user with no nats.password),
		// not a token; a token is one only as Token.
		{"", Options{User: "bob"}, connectInfo{User: "bob"}},
		{"", Options{Token: "tok"}, connectInfo{Token: "tok"}},
		{"alice:pw@", Options{Token: "tok"}, connectInfo{User: "alice", Pass: "pw"}},
	} {
		got := make(chan connectInfo, 1)
		url := acceptOne(t, func(conn net.Conn) {
			_, _ = conn.Write([]byte("INFO {\"server_id\":\"fake\",\"headers\":true,\"nonce\":\"n0nce\"}\r\n"))
			line, err := bufio.NewReader(conn).ReadString('\n')
			var ci connectInfo
			if err == nil {
				err = json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "CONNECT ")), &ci)
			}
			if err != nil {
				t.Errorf("CONNECT %q: %v", line, err)
			}
			got <- ci
			_, _ = conn.Write([]byte("-ERR 'Authorization Violation'\r\n"))
		})
		c.o.URL = strings.Replace(url, "nats://", "nats://"+c.userinfo, 1)
		_, _ = Dial(testCtx(t, 10*time.Second), c.o)
		ci := <-got
		if ci.User != c.want.User || ci.Pass != c.want.Pass || ci.Token != c.want.Token || (ci.NKey != "") != (c.o.NKeyFile != "" && c.userinfo == "") {
			t.Errorf("URL user info %q, options %+v: CONNECT user %q pass %q token %q nkey %q; want user %q pass %q token %q",
				c.userinfo, c.o, ci.User, ci.Pass, ci.Token, ci.NKey, c.want.User, c.want.Pass, c.want.Token)
		}
	}
}

// captureConn holds back what is written to it while held is set.
type captureConn struct {
	net.Conn
	held []byte
	hold bool
}

func (c *captureConn) Write(b []byte) (int, error) {
	if c.hold {
		c.held = append(c.held, b...)
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// Under TLS, LastRead tells that bytes come while a TLS record (up to
// 16 KiB) is still arriving: it notes the reads beneath TLS. (It noted
// those through TLS, which return only once a record is whole: below ~130
// kbit/s a frame still arriving looked silent for a second and more.)
func TestTLSLastReadAdvancesWithinARecord(t *testing.T) {
	srvCfg, roots := testPKI(t)
	srvCfg.DynamicRecordSizingDisabled = true // the message in one record
	release := make(chan struct{})
	url := acceptOne(t, func(conn net.Conn) {
		_, _ = conn.Write([]byte(`INFO {"server_id":"fake","headers":true,"max_payload":1048576,"tls_required":true}` + "\r\n"))
		cc := &captureConn{Conn: conn}
		tc := tls.Server(cc, srvCfg)
		br := bufio.NewReader(tc)
		if !readToPing(br) {
			return
		}
		_, _ = tc.Write([]byte("PONG\r\n"))
		// One record: a message for a sid nobody has, sent in 20 pieces
		// over 2 s, the last held back until the test has looked.
		cc.hold = true
		_, _ = fmt.Fprintf(tc, "MSG S.x 99 %d\r\n%s\r\n", 16000, strings.Repeat("x", 16000))
		cc.hold = false
		rec := cc.held
		piece := len(rec)/20 + 1
		for len(rec) > piece {
			_, _ = conn.Write(rec[:piece])
			rec = rec[piece:]
			time.Sleep(100 * time.Millisecond)
		}
		<-release
		_, _ = conn.Write(rec)
		_, _ = br.ReadString(0) // until the client closes
	})
	t.Cleanup(func() { close(release) })
	ctx := testCtx(t, 30*time.Second)
	c, err := Dial(ctx, Options{URL: url, TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	before := c.LastRead()
	eventually(t, 3*time.Second, "LastRead advancing within a TLS record", func() bool { return c.LastRead().After(before) })
}
