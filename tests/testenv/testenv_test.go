package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { Main(m) }

func TestPostgresGivesEachTestItsOwnDatabase(t *testing.T) {
	a, b := Postgres(t), Postgres(t)
	if a.URL == b.URL {
		t.Fatalf("two calls gave the same database %s", a.URL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var db string
	if err := a.Conn(t).QueryRow(ctx, "select current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if db == "postgres" {
		t.Fatalf("test ran in the maintenance database")
	}
}

func TestClusterStopStart(t *testing.T) {
	c := NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ping := func() error {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("fresh cluster: %v", err)
	}
	if err := c.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err == nil {
		t.Fatal("stopped cluster still answers")
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ping(); err != nil {
		t.Fatalf("restarted cluster: %v", err)
	}
}

func TestNATSRestartKeepsStreams(t *testing.T) {
	n := NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	n.Shutdown()
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	// The client reconnects on its own; poll until the stream answers.
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, err := js.Stream(ctx, "T")
		if err == nil {
			info, err := s.Info(ctx)
			if err == nil && info.State.Msgs == 1 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream not back after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
