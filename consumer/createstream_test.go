package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

// A stream deleted and made again at once, the account's only one, is
// made: nats-server may refuse the create while it removes the account's
// emptied folders (CreateStream). Without the tries again this failed in
// each of three runs under -race (and bench's probe of the same race in
// each of four, after 30 to 400 pairs).
func TestCreateStreamAfterDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js := jsFor(t, testenv.NATS(t)) // a server of its own: no other stream in the account
	sc := jetstream.StreamConfig{Name: "AGAIN", Subjects: []string{"again"}, Storage: jetstream.FileStorage}
	for i := range 1500 {
		if _, err := CreateStream(ctx, js, sc); err != nil {
			t.Fatalf("pair %d: %v", i, err)
		}
		if err := js.DeleteStream(ctx, sc.Name); err != nil {
			t.Fatalf("pair %d: delete: %v", i, err)
		}
	}
}
