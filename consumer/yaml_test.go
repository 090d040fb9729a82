package consumer

import (
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestConfigYAML decodes the nats: section as DESIGN.md writes it, onto
// the defaults, and checks every key lands in its field.
func TestConfigYAML(t *testing.T) {
	const doc = `
url: nats://10.0.0.1:4222
creds_file: /etc/jetsink/nats.creds
tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem}
stream: ORDERS
subjects: ["orders.>", "refunds.*"]
create_stream: true
consumer: pg
filter_subject: orders.eu.>
ack_wait: 45s
max_deliver: 5
max_ack_pending: 20000
dead_letter_subject: jetsink.dlq.ORDERS
pull_max_messages: 2048
pull_max_bytes: 8388608
pull_expiry: 20s
pull_heartbeat: 2s
`
	cfg := DefaultConfig()
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	want := Config{
		URL:               "nats://10.0.0.1:4222",
		CredsFile:         "/etc/jetsink/nats.creds",
		TLS:               TLSConfig{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem"},
		Stream:            "ORDERS",
		Subjects:          []string{"orders.>", "refunds.*"},
		CreateStream:      true,
		Consumer:          "pg",
		FilterSubject:     "orders.eu.>",
		AckWait:           45 * time.Second,
		MaxDeliver:        5,
		MaxAckPending:     20000,
		DeadLetterSubject: "jetsink.dlq.ORDERS",
		PullMaxMessages:   2048,
		PullMaxBytes:      8 << 20,
		PullExpiry:        20 * time.Second,
		PullHeartbeat:     2 * time.Second,
	}
	if cfg.URL != want.URL || cfg.CredsFile != want.CredsFile || cfg.TLS != want.TLS || cfg.Stream != want.Stream ||
		len(cfg.Subjects) != 2 || cfg.Subjects[0] != want.Subjects[0] || cfg.Subjects[1] != want.Subjects[1] ||
		cfg.CreateStream != want.CreateStream || cfg.Consumer != want.Consumer || cfg.FilterSubject != want.FilterSubject ||
		cfg.AckWait != want.AckWait || cfg.MaxDeliver != want.MaxDeliver || cfg.MaxAckPending != want.MaxAckPending ||
		cfg.DeadLetterSubject != want.DeadLetterSubject || cfg.PullMaxMessages != want.PullMaxMessages ||
		cfg.PullMaxBytes != want.PullMaxBytes || cfg.PullExpiry != want.PullExpiry || cfg.PullHeartbeat != want.PullHeartbeat {
		t.Fatalf("decoded\n%+v\nwant\n%+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}

	var auth Config
	if err := yaml.Unmarshal([]byte("user: u\npassword: p\nnkey_file: /n.nk\n"), &auth); err != nil {
		t.Fatal(err)
	}
	if auth.User != "u" || auth.Password != "p" || auth.NKeyFile != "/n.nk" {
		t.Fatalf("auth keys decoded as %+v", auth)
	}
}
