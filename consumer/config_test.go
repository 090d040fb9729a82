package consumer

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/jetsink/jetsink/tests/testenv"
)

// sentinel stands in for a secret; no error or log line may contain it.
const sentinel = "S3CRET-SENTINEL-d41d8cd9"

func TestDefaultConfigIsValid(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	if cfg.URL != "nats://127.0.0.1:4222" || cfg.Stream != "EVENTS" || cfg.Consumer != "jetsink" ||
		cfg.AckWait != 30*time.Second || cfg.MaxDeliver != 10 || cfg.DeadLetterSubject != "jetsink.dlq.EVENTS" ||
		len(cfg.Subjects) != 1 || cfg.Subjects[0] != "events.>" || cfg.CreateStream || cfg.MaxAckPending != 0 {
		t.Fatalf("DefaultConfig() differs from DESIGN.md: %+v", cfg)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		key    string // "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"url empty", func(c *Config) { c.URL = " " }, "nats.url"},
		{"url not a url", func(c *Config) { c.URL = "127.0.0.1" }, "nats.url"},
		{"url bad scheme", func(c *Config) { c.URL = "http://127.0.0.1:4222" }, "nats.url"},
		{"url list", func(c *Config) { c.URL = "nats://a:4222, tls://b:4222" }, ""},
		{"url list with bad entry", func(c *Config) { c.URL = "nats://a:4222,:bad" }, "nats.url"},
		{"user and password", func(c *Config) { c.User, c.Password = "u", "p" }, ""},
		{"password without user", func(c *Config) { c.Password = "p" }, "nats.password"},
		{"user and creds", func(c *Config) { c.User, c.CredsFile = "u", "/x.creds" }, "nats.user/password"},
		{"creds and nkey", func(c *Config) { c.CredsFile, c.NKeyFile = "/x.creds", "/x.nk" }, "nats.creds_file"},
		{"creds alone", func(c *Config) { c.CredsFile = "/x.creds" }, ""},
		{"tls cert without key", func(c *Config) { c.TLS.CertFile = "/c.pem" }, "nats.tls.cert_file"},
		{"tls key without cert", func(c *Config) { c.TLS.KeyFile = "/k.pem" }, "nats.tls.cert_file"},
		{"tls full", func(c *Config) { c.TLS = TLSConfig{CAFile: "/ca", CertFile: "/c", KeyFile: "/k"} }, ""},
		{"stream empty", func(c *Config) { c.Stream = "" }, "nats.stream"},
		{"stream with dot", func(c *Config) { c.Stream = "EV.ENTS" }, "nats.stream"},
		{"stream with wildcard", func(c *Config) { c.Stream = "EV*" }, "nats.stream"},
		{"stream with space", func(c *Config) { c.Stream = "EV ENTS" }, "nats.stream"},
		{"stream with slash", func(c *Config) { c.Stream = "EV/ENTS" }, "nats.stream"},
		{"stream too long", func(c *Config) { c.Stream = strings.Repeat("S", 256) }, "nats.stream"},
		{"consumer empty", func(c *Config) { c.Consumer = "" }, "nats.consumer"},
		{"consumer with >", func(c *Config) { c.Consumer = "a>" }, "nats.consumer"},
		{"consumer with tab", func(c *Config) { c.Consumer = "a\tb" }, "nats.consumer"},
		{"create without subjects", func(c *Config) { c.CreateStream, c.Subjects = true, nil }, "nats.subjects"},
		{"bind without subjects", func(c *Config) { c.Subjects = nil }, ""},
		{"subject empty token", func(c *Config) { c.Subjects = []string{"events..x"} }, "nats.subjects[0]"},
		{"subject > not last", func(c *Config) { c.Subjects = []string{"a.>.b"} }, "nats.subjects[0]"},
		{"subject partial wildcard", func(c *Config) { c.Subjects = []string{"a.b*"} }, "nats.subjects[0]"},
		{"subject with space", func(c *Config) { c.Subjects = []string{"a", "a b"} }, "nats.subjects[1]"},
		{"filter subject bad", func(c *Config) { c.FilterSubject = "events." }, "nats.filter_subject"},
		{"filter subject ok", func(c *Config) { c.FilterSubject = "events.*.x" }, ""},
		{"ack_wait below 1s", func(c *Config) { c.AckWait = 999 * time.Millisecond }, "nats.ack_wait"},
		{"ack_wait 1s", func(c *Config) { c.AckWait = time.Second }, ""},
		{"stream limits", func(c *Config) { c.CreateStream, c.StreamMaxAge, c.StreamMaxBytes = true, 7*24*time.Hour, 10<<30 }, ""},
		{"stream_max_age negative", func(c *Config) { c.CreateStream, c.StreamMaxAge = true, -time.Hour }, "nats.stream_max_age"},
		{"stream_max_age within ack_wait", func(c *Config) { c.CreateStream, c.StreamMaxAge = true, c.AckWait }, "nats.stream_max_age"},
		{"stream_max_bytes negative", func(c *Config) { c.CreateStream, c.StreamMaxBytes = true, -1 }, "nats.stream_max_bytes"},
		{"stream limits without create_stream", func(c *Config) { c.StreamMaxBytes = 1 << 30 }, "nats.create_stream"},
		{"stream_replicas", func(c *Config) { c.CreateStream, c.StreamReplicas = true, 3 }, ""},
		{"stream_duplicate_window", func(c *Config) { c.CreateStream, c.StreamDuplicateWindow = true, 10*time.Second }, ""},
		{"stream_duplicate_window up to max_age", func(c *Config) {
			c.CreateStream, c.StreamMaxAge, c.StreamDuplicateWindow = true, time.Hour, time.Hour
		}, ""},
		{"stream_duplicate_window negative", func(c *Config) { c.CreateStream, c.StreamDuplicateWindow = true, -time.Second }, "nats.stream_duplicate_window"},
		{"stream_duplicate_window under 100ms", func(c *Config) { c.CreateStream, c.StreamDuplicateWindow = true, 99*time.Millisecond }, "nats.stream_duplicate_window"},
		{"stream_duplicate_window over max_age", func(c *Config) {
			c.CreateStream, c.StreamMaxAge, c.StreamDuplicateWindow = true, time.Hour, time.Hour+time.Second
		}, "nats.stream_duplicate_window"},
		{"stream_duplicate_window without create_stream", func(c *Config) { c.StreamDuplicateWindow = 10 * time.Second }, "nats.create_stream: true"},
		{"stream_replicas 6", func(c *Config) { c.CreateStream, c.StreamReplicas = true, 6 }, "nats.stream_replicas"},
		{"stream_replicas negative", func(c *Config) { c.CreateStream, c.StreamReplicas = true, -1 }, "nats.stream_replicas"},
		{"stream_replicas without create_stream", func(c *Config) { c.StreamReplicas = 3 }, "nats.create_stream"},
		{"max_deliver 0", func(c *Config) { c.MaxDeliver = 0 }, "nats.max_deliver"},
		{"max_deliver -2", func(c *Config) { c.MaxDeliver = -2 }, "nats.max_deliver"},
		{"max_deliver unlimited", func(c *Config) { c.MaxDeliver = -1 }, ""},
		{"max_deliver 1", func(c *Config) { c.MaxDeliver = 1 }, ""},
		{"max_deliver huge", func(c *Config) { c.MaxDeliver = math.MaxInt32 }, "nats.max_deliver"},
		{"max_deliver largest", func(c *Config) { c.MaxDeliver = math.MaxInt32 - 1 }, ""},
		{"max_ack_pending -2", func(c *Config) { c.MaxAckPending = -2 }, "nats.max_ack_pending"},
		{"max_ack_pending below pull", func(c *Config) { c.MaxAckPending, c.PullMaxMessages = 10, 20 }, "nats.max_ack_pending"},
		{"max_ack_pending below the derived pull", func(c *Config) { c.MaxAckPending = 10 }, ""},
		{"max_ack_pending unlimited", func(c *Config) { c.MaxAckPending = -1 }, ""},
		{"max_ack_pending explicit", func(c *Config) { c.MaxAckPending = 50000 }, ""},
		{"pull_max_messages derived", func(c *Config) { c.PullMaxMessages = 0 }, ""},
		{"pull_max_messages negative", func(c *Config) { c.PullMaxMessages = -1 }, "nats.pull_max_messages must be 0 (derived) or 1 to"},
		{"pull_max_messages too large", func(c *Config) { c.PullMaxMessages = MaxPullMessages + 1 }, "nats.pull_max_messages must be 0 (derived) or 1 to"},
		{"pull_max_bytes negative", func(c *Config) { c.PullMaxBytes = -1 }, "nats.pull_max_bytes"},
		{"pull_max_bytes set", func(c *Config) { c.PullMaxBytes = 8 << 20 }, ""},
		{"max_in_flight_bytes below -1", func(c *Config) { c.MaxInFlightBytes = -2 }, "nats.max_in_flight_bytes"},
		{"max_in_flight_bytes unbounded", func(c *Config) { c.MaxInFlightBytes = -1 }, ""},
		{"pull_expiry below 1s", func(c *Config) { c.PullExpiry = 500 * time.Millisecond }, "nats.pull_expiry must be at least 1s"},
		{"pull_heartbeat too small", func(c *Config) { c.PullHeartbeat = 50 * time.Millisecond }, "nats.pull_heartbeat"},
		{"pull_heartbeat 100ms", func(c *Config) { c.PullHeartbeat = 100 * time.Millisecond }, ""},
		{"pull_heartbeat 45s", func(c *Config) { c.PullExpiry, c.PullHeartbeat = 2*time.Minute, 45*time.Second }, ""},
		{"pull_heartbeat over half expiry", func(c *Config) { c.PullHeartbeat = 16 * time.Second }, "nats.pull_heartbeat"},
		{"dlq empty", func(c *Config) { c.DeadLetterSubject = "" }, "nats.dead_letter_subject"},
		{"dlq wildcard", func(c *Config) { c.DeadLetterSubject = "dlq.*" }, "nats.dead_letter_subject"},
		{"dlq bad token", func(c *Config) { c.DeadLetterSubject = "dlq..x" }, "nats.dead_letter_subject"},
		{"dlq captured by stream", func(c *Config) {
			c.CreateStream, c.DeadLetterSubject = true, "events.dlq"
		}, "nats.dead_letter_subject"},
		{"dlq captured by *", func(c *Config) {
			c.CreateStream, c.Subjects, c.DeadLetterSubject = true, []string{"a", "dlq.*"}, "dlq.x"
		}, "nats.dead_letter_subject"},
		{"dlq outside stream", func(c *Config) {
			c.CreateStream, c.Subjects, c.DeadLetterSubject = true, []string{"dlq.*"}, "dlq.x.y"
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.change(&cfg)
			err := cfg.Validate()
			if tt.key == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.key) {
				t.Fatalf("Validate() = %q, want it to name %s", err, tt.key)
			}
			if strings.Contains(err.Error(), "\n") { // errors.Join's
				t.Fatalf("Validate() = %q, want one problem for one wrong value", err)
			}
		})
	}
}

// TestValidateNeverQuotesSecrets runs every rule that can fire with a
// secret in the config and checks the secret is not in the message.
func TestValidateNeverQuotesSecrets(t *testing.T) {
	cases := []func(*Config){
		func(c *Config) { c.User, c.Password, c.CredsFile = "u", sentinel, "/x.creds" },
		func(c *Config) { c.Password = sentinel },
		func(c *Config) { c.URL = "nats://u:" + sentinel + "@host:notaport" },
		func(c *Config) { c.URL = "ftp://u:" + sentinel + "@host:4222" },
		func(c *Config) { c.URL = "nats://a:4222,%%" + sentinel },
		func(c *Config) { c.URL = "u:" + sentinel + "@host:4222" },
		func(c *Config) { c.URL = "u:" + sentinel },      // user:password, no host
		func(c *Config) { c.URL = sentinel + ":123456" }, // user:PIN reads as host:port
	}
	for i, change := range cases {
		cfg := DefaultConfig()
		change(&cfg)
		err := cfg.Validate()
		if err == nil {
			t.Fatalf("case %d: Validate() = nil, want an error", i)
		}
		if strings.Contains(err.Error(), sentinel) {
			t.Fatalf("case %d: error quotes the secret: %v", i, err)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{">", "a", true},
		{"*.b", "a.b", true},
		{"*.b", "a.c", false},
		{"events.>", "jetsink.dlq.EVENTS", false},
	}
	for _, tt := range tests {
		if got := SubjectMatches(tt.pattern, tt.subject); got != tt.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tt.pattern, tt.subject, got, tt.want)
		}
	}
}

func TestDeriveMaxAckPending(t *testing.T) {
	cfg := DefaultConfig()
	if got := cfg.maxAckPending(); got != DefaultMaxAckPending {
		t.Fatalf("maxAckPending() with 0 = %d, want %d", got, DefaultMaxAckPending)
	}
	cfg.DeriveMaxAckPending(5000)
	if want := 5000 + DefaultPullMaxMessages; cfg.MaxAckPending != want {
		t.Fatalf("DeriveMaxAckPending(5000) set %d, want %d", cfg.MaxAckPending, want)
	}
	cfg.DeriveMaxAckPending(1) // explicit (or already derived) values stay
	if want := 5000 + DefaultPullMaxMessages; cfg.MaxAckPending != want {
		t.Fatalf("DeriveMaxAckPending overwrote an explicit value: %d", cfg.MaxAckPending)
	}
	cfg = DefaultConfig()
	cfg.DeriveMaxAckPending(20000) // the default chain: capped
	if cfg.MaxAckPending != MaxDerivedAckPending {
		t.Fatalf("DeriveMaxAckPending(20000) set %d, want the cap %d", cfg.MaxAckPending, MaxDerivedAckPending)
	}
	cfg = DefaultConfig()
	cfg.PullMaxMessages = 2 * MaxDerivedAckPending // validation wants max_ack_pending >= this
	cfg.DeriveMaxAckPending(20000)
	if cfg.MaxAckPending != cfg.PullMaxMessages {
		t.Fatalf("DeriveMaxAckPending with pull_max_messages %d set %d, want as many", cfg.PullMaxMessages, cfg.MaxAckPending)
	}
}

func TestOneLine(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"two\nlines\r\n", "two lines"},
		{"tab\there", "tab here"},
		{"bad \xff utf8", "bad ? utf8"},
		{"sep\u2028x", "sep x"},
		{strings.Repeat("é", 400), strings.Repeat("é", MaxReasonLen/2)},
	}
	for _, tt := range tests {
		if got := oneLine(tt.in, MaxReasonLen); got != tt.want {
			t.Errorf("oneLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestNakDelay(t *testing.T) {
	want := []time.Duration{2 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 60 * time.Second, 60 * time.Second}
	for d, w := range want {
		if got := nakDelay(uint64(d)); got != w {
			t.Errorf("nakDelay(%d) = %s, want %s", d, got, w)
		}
	}
	if got := nakDelay(1 << 40); got != 60*time.Second {
		t.Errorf("nakDelay(huge) = %s", got)
	}
}

func ExampleConfig_Validate() {
	cfg := DefaultConfig()
	cfg.AckWait = 500 * time.Millisecond
	err := cfg.Validate()
	fmt.Println(errors.Is(err, ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// invalid config: nats.ack_wait must be at least 1s (got 500ms)
}

func TestConnectErrorHidesCredentials(t *testing.T) {
	cause := errors.New("nats: no servers available for connection")
	err := Config{URL: "nats://alice:s3cret@a.example:4222, tls://tok3n@b.example:4443?x=s3cret,carol:s3@cret@c.example:4222,nats://dave:12/s3cret@d.example:4222"}.ConnectError(cause)
	if !errors.Is(err, cause) {
		t.Fatalf("%v does not wrap its cause", err)
	}
	msg := err.Error()
	for _, secret := range []string{"s3cret", "tok3n", "alice", "carol", "cret", "dave"} {
		if strings.Contains(msg, secret) {
			t.Errorf("%q shows %q", msg, secret)
		}
	}
	if !strings.Contains(msg, "nats://a.example:4222,tls://b.example:4443,c.example:4222,nats://d.example:4222") || !strings.Contains(msg, "JETSINK_NATS_URL") {
		t.Errorf("%q does not name the servers and what to set", msg)
	}
}

// The server nats.go is connected to comes as url.URL.String(), which
// leaves a comma in the user info unescaped (a password written %2C in
// nats.url): cut at the comma, the log showed the user and the password's
// start.
func TestServerOfAConnectedURL(t *testing.T) {
	for in, want := range map[string]string{
		(&url.URL{Scheme: "nats", User: url.UserPassword("alice", "s3,cret"), Host: "h:4222"}).String(): "nats://h:4222",
		(&url.URL{Scheme: "tls", User: url.User("tok,3n"), Host: "h:4443"}).String():                    "tls://h:4443",
		"nats://alice:s3cret@h:4222": "nats://h:4222",
		"nats://h:4222":              "nats://h:4222",
		"nats://a,l:s3@cret@h:4222":  "nats://h:4222", // url.Parse refuses it; cut at the last @
	} {
		if got := serverOf(in); got != want {
			t.Errorf("serverOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateURLWithoutScheme(t *testing.T) {
	cfg := DefaultConfig()
	cfg.URL = "nats://a:4222, 127.0.0.1:4222"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "entry 2 has no scheme: put nats:// before its host:port") {
		t.Fatalf("Validate() = %v", err)
	}
	// Every entry at fault, each on a line of its own.
	cfg.URL = "127.0.0.1:4222,nats://a:4222,http://b:4222,:x,nats://u:p@c:99999,tls://d:0,nats://e:65535,nats://f"
	err := cfg.Validate()
	want := []string{"entry 1 has no scheme", "entry 3 has scheme \"http\"", "entry 4 is not a URL",
		"entry 5 has port 99999; a port is 1 to 65535", "entry 6 has port 0;"}
	if got := strings.Split(fmt.Sprint(err), "\n"); len(got) != len(want) {
		t.Fatalf("Validate() = %q, want %d problems", err, len(want))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %q, lacks %q", err, w)
		}
	}
}

// A creds file that cannot be read or is not a user's credentials (a user
// JWT and that user's seed) is a bad configuration (ErrInvalidConfig: exit
// 2) from AuthOptions, never quoted; a good one is taken. Before, nats.go
// found out only while connecting, and it read as a server that cannot be
// reached; a seed alone was sent to the server as the JWT. "~" is not
// expanded: nats.go reads the seed from the path as written.
func TestAuthOptionsChecksTheCredsFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	aseed, err := account.Seed()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.NewUserClaims(pub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatal(err)
	}
	good := write("good.creds", string(creds))
	write("home.creds", string(creds))
	other, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	oseed, err := other.Seed()
	if err != nil {
		t.Fatal(err)
	}
	jwtBlock := "-----BEGIN NATS USER JWT-----\n" + token + "\n------END NATS USER JWT------\n\n"
	seedBlock := func(seed []byte) string {
		return "-----BEGIN USER NKEY SEED-----\n" + string(seed) + "\n------END USER NKEY SEED------\n"
	}
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"good", good, true},
		{"CRLF", write("crlf.creds", strings.ReplaceAll(string(creds), "\n", "\r\n")), true},
		{"under ~", "~/home.creds", false},
		{"missing", filepath.Join(dir, "none.creds"), false},
		{"a directory", dir, false},
		{"JWT alone", write("jwt.creds", jwtBlock), false},
		{"seed alone", write("user.nk", string(seed)+"\n"), false},
		{"seed block alone", write("seed.creds", seedBlock(seed)), false},
		{"an account's seed", write("account.creds", jwtBlock+seedBlock(aseed)), false},
		{"another user's seed", write("other.creds", jwtBlock+seedBlock(oseed)), false},
		{"garbage", write("garbage.creds", sentinel), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.CredsFile = tc.path
			opts, err := cfg.AuthOptions()
			if tc.ok {
				if err != nil || len(opts) != 1 {
					t.Fatalf("AuthOptions = %d options, %v; want the creds option", len(opts), err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "nats.creds_file") {
				t.Fatalf("AuthOptions = %v, want ErrInvalidConfig naming nats.creds_file", err)
			}
			if strings.Contains(err.Error(), sentinel) || strings.Contains(err.Error(), string(seed)) || strings.Contains(err.Error(), token) ||
				strings.Contains(err.Error(), string(oseed)) {
				t.Fatalf("the error quotes the file: %v", err)
			}
		})
	}
}

// nats.tls's files that cannot be read or used are a bad configuration
// (ErrInvalidConfig: exit 2) from AuthOptions, for every client jetsink
// opens. Before, nats.go found out only while connecting, which read as a
// server that cannot be reached (exit 1), while the wire pull client
// already refused the same files.
func TestAuthOptionsChecksTheTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.CAFile(t)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  TLSConfig
		key  string // the setting the error names; "" when it is fine
	}{
		{"a CA", TLSConfig{CAFile: ca}, ""},
		{"a missing CA", TLSConfig{CAFile: filepath.Join(dir, "none.pem")}, "nats.tls.ca_file"},
		{"a CA without PEM", TLSConfig{CAFile: notPEM}, "nats.tls.ca_file"},
		{"a missing certificate", TLSConfig{CertFile: filepath.Join(dir, "none.pem"), KeyFile: filepath.Join(dir, "none.key")}, "nats.tls.cert_file"},
		{"a certificate without a key", TLSConfig{CertFile: ca, KeyFile: notPEM}, "nats.tls.cert_file"},
	} {
		cfg := DefaultConfig()
		cfg.TLS = tc.tls
		_, err := cfg.AuthOptions()
		switch {
		case tc.key == "" && err != nil:
			t.Errorf("%s: AuthOptions = %v", tc.name, err)
		case tc.key != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.key)):
			t.Errorf("%s: AuthOptions = %v, want ErrInvalidConfig naming %s", tc.name, err, tc.key)
		}
	}
}

// nats.go's subscription drops what it holds beyond 500,000 messages: its
// pulls ask for at most half that, whatever pull_max_messages allows the
// wire client.
func TestNATSGoPullMessages(t *testing.T) {
	for _, tc := range []struct {
		set, want int
		lowered   bool
	}{
		{DefaultPullMaxMessages, DefaultPullMaxMessages, false},
		{250_000, 250_000, false},
		{250_001, 250_000, true},
		{MaxPullMessages, 250_000, true},
	} {
		if got, lowered := natsGoPullMessages(tc.set, false); got != tc.want || lowered != tc.lowered {
			t.Errorf("pull_max_messages %d: nats.go pulls %d (lowered %v), want %d (%v)", tc.set, got, lowered, tc.want, tc.lowered)
		}
	}
	// Derived: at most 1,024 (its pulls have no byte cap), not a lowering.
	for _, pull := range []int{DefaultPullMaxMessages, 100} {
		if got, lowered := natsGoPullMessages(pull, true); got != min(pull, natsGoDerivedPullMessages) || lowered {
			t.Errorf("derived %d: nats.go pulls %d (lowered %v)", pull, got, lowered)
		}
	}
}

// pull_max_messages 0 derives 4,096, no more than max_ack_pending; a set
// one is kept.
func TestPullMessages(t *testing.T) {
	for _, tc := range []struct {
		pull, ackPending, want int
	}{
		{0, 0, DefaultPullMaxMessages},
		{0, -1, DefaultPullMaxMessages},
		{0, 10_000, DefaultPullMaxMessages},
		{0, 1000, 1000},
		{2000, 0, 2000},
		{20_000, 30_000, 20_000},
	} {
		cfg := DefaultConfig()
		cfg.PullMaxMessages, cfg.MaxAckPending = tc.pull, tc.ackPending
		if got := cfg.PullMessages(); got != tc.want {
			t.Errorf("pull_max_messages %d, max_ack_pending %d: pulls %d, want %d", tc.pull, tc.ackPending, got, tc.want)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("pull_max_messages %d, max_ack_pending %d: %v", tc.pull, tc.ackPending, err)
		}
	}
}
