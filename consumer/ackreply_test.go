package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

func TestParseAckReply(t *testing.T) {
	ts := time.Date(2026, 11, 29, 12, 0, 0, 123, time.UTC)
	tm := "1795953600000000123"
	for _, tc := range []struct {
		reply string
		ok    bool
		want  ackMeta
	}{
		{"$JS.ACK.EVENTS.jetsink.3.1042.77." + tm + ".9", true, ackMeta{"EVENTS", 3, 1042, 77, ts, 9}},
		{"$JS.ACK._.HASH.EVENTS.jetsink.1.5.6." + tm + ".12.RANDOM", true, ackMeta{"EVENTS", 1, 5, 6, ts, 12}},
		{"$JS.ACK.hub.HASH.S.c.2.5.6." + tm + ".0", true, ackMeta{"S", 2, 5, 6, ts, 0}},         // 11 tokens
		{"$JS.ACK.hub.HASH.S.c.2.5.6." + tm + ".0.R.extra", true, ackMeta{"S", 2, 5, 6, ts, 0}}, // future tokens
		{"$JS.ACK.S.c.x.5.6." + tm + ".0", true, ackMeta{"S", 0, 5, 6, ts, 0}},                  // not a number reads 0
		{"$JS.ACK.S.c.1.5.6." + tm, false, ackMeta{}},                                           // 8 tokens
		{"$JS.ACK.a.b.S.c.1.5.6." + tm + "", false, ackMeta{}},                                  // 10 tokens
		{"_INBOX.abc.def.1.2.3.4.5.6", false, ackMeta{}},
		{"", false, ackMeta{}},
	} {
		got, ok := parseAckReply(tc.reply)
		if ok != tc.ok || (ok && (got.stream != tc.want.stream || got.delivered != tc.want.delivered ||
			got.streamSeq != tc.want.streamSeq || got.consSeq != tc.want.consSeq || !got.published.Equal(tc.want.published) ||
			got.pending != tc.want.pending)) {
			t.Errorf("parseAckReply(%q) = %+v, %v; want %+v, %v", tc.reply, got, ok, tc.want, tc.ok)
		}
	}
}

// What the server really sends parses the same as nats.go's Metadata.
func TestParseAckReplyMatchesMetadata(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := testenv.NATS(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACKREPLY", Subjects: []string{"ackreply.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "ackreply.x", []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ACKREPLY", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := parseAckReply(msg.Reply())
		if !ok || got.stream != md.Stream || got.delivered != md.NumDelivered || got.streamSeq != md.Sequence.Stream ||
			got.consSeq != md.Sequence.Consumer || !got.published.Equal(md.Timestamp) || got.pending != md.NumPending {
			t.Fatalf("parseAckReply(%q) = %+v, %v; Metadata says %+v", msg.Reply(), got, ok, md)
		}
	}
	if n != 3 {
		t.Fatalf("fetched %d messages, want 3: %v", n, batch.Error())
	}
}
