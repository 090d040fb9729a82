package loadgen

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/tests/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestEventIsDeterministicValidJSON(t *testing.T) {
	a, b := Make(7, 42, 1000), Make(7, 42, 1000)
	if a != b {
		t.Fatalf("Make is not deterministic: %+v vs %+v", a, b)
	}
	if c := Make(8, 42, 1000); c.ID == a.ID {
		t.Fatal("different runs give the same id")
	}
	js := a.AppendJSON(nil)
	if n := len(js); n < 150 || n > 220 {
		t.Errorf("event is %d bytes, want about 180: %s", n, js)
	}
	var got struct {
		ID     string    `json:"id"`
		TS     time.Time `json:"ts"`
		Device string    `json:"device"`
		Kind   string    `json:"kind"`
		Value  float64   `json:"value"`
		Seq    uint64    `json:"seq"`
		Tags   struct{ Site, Rack string }
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", js, err)
	}
	u, err := uuid.Parse(got.ID)
	if err != nil || u.Version() != 4 || got.ID != a.UUID() {
		t.Errorf("id %q: %v (version %d)", got.ID, err, u.Version())
	}
	if !got.TS.Equal(a.TS) || got.Device != a.Device || got.Kind != a.Kind || got.Value != a.Value ||
		got.Seq != 42 || got.Tags.Site != a.Site || got.Tags.Rack != a.Rack {
		t.Errorf("decoded %+v from %s, want %+v", got, js, a)
	}
	if a.Subject("events") != "events.dev-42" {
		t.Errorf("subject %s", a.Subject("events"))
	}
}

func TestPublishStoresEveryEventOnce(t *testing.T) {
	ns := testenv.NATS(t)
	nc := ns.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LG", Subjects: []string{"lg.>"}})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Subject: "lg", Subjects: 50, Events: 5000, Run: 1}
	res, err := Publish(ctx, nc, opts)
	if err != nil || res.Acked != 5000 {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	// Same run again: Nats-Msg-Id makes JetStream store nothing new.
	if _, err := Publish(ctx, nc, opts); err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 5000 || info.State.NumSubjects != 50 {
		t.Fatalf("stream holds %d messages on %d subjects, want 5000 on 50", info.State.Msgs, info.State.NumSubjects)
	}
}

func TestPublishOpenLoopAndFailures(t *testing.T) {
	ns := testenv.NATS(t)
	nc := ns.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// No stream captures the subject: every publish must be counted failed.
	res, err := Publish(ctx, nc, Options{Subject: "nowhere", Events: 20, Run: 2})
	if err == nil || res.Failed != 20 {
		t.Fatalf("publish without a stream: %+v, %v", res, err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OL", Subjects: []string{"ol.>"}}); err != nil {
		t.Fatal(err)
	}
	res, err = Publish(ctx, nc, Options{Subject: "ol", Rate: 2000, Duration: 250 * time.Millisecond, Run: 3})
	if err != nil || res.Sent != 500 || res.Acked != 500 {
		t.Fatalf("open loop: %+v, %v", res, err)
	}
}

func TestPublishStampsScheduledSendTime(t *testing.T) {
	ns := testenv.NATS(t)
	nc := ns.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ST", Subjects: []string{"st.>"}})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if _, err := Publish(ctx, nc, Options{Subject: "st", Rate: 1000, Duration: 100 * time.Millisecond, Run: 4, Stamp: true}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	ts := func(seq uint64) time.Time {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev struct{ TS time.Time }
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		return ev.TS
	}
	first, last := ts(1), ts(100)
	// Open loop: event i is stamped start + i*interval, exactly, whenever it was sent.
	if got := last.Sub(first); got != 99*time.Millisecond {
		t.Errorf("stamps of events 0 and 99 are %v apart, want 99ms", got)
	}
	if first.Before(before.Truncate(time.Microsecond)) || last.After(after) {
		t.Errorf("stamps %v..%v outside the publish window %v..%v", first, last, before, after)
	}
}
