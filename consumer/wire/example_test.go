package wire_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsink/jetsink/consumer/wire"
	"github.com/jetsink/jetsink/embedded"
)

// Streams and consumers are made with nats.go; wire only pulls and settles.
func ExampleConn_Consume() {
	srv, err := embedded.StartNATS("")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	_, _ = js.CreateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "sink", AckPolicy: jetstream.AckExplicitPolicy})
	m := nats.NewMsg("orders.eu")
	m.Header.Set("Nats-Msg-Id", "order-1")
	m.Data = []byte(`{"qty":3}`)
	if _, err := js.PublishMsg(ctx, m); err != nil {
		fmt.Println(err)
		return
	}

	c, err := wire.Dial(ctx, wire.Options{URL: srv.URL(), Name: "example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	got := make(chan struct{})
	sub, err := c.Consume(wire.PullOptions{Stream: "ORDERS", Consumer: "sink"}, func(m *wire.Msg) {
		fmt.Println(m.Subject(), m.HeaderGet("Nats-Msg-Id"), string(m.Data()))
		if err := m.Ack(); err != nil {
			fmt.Println(err)
		}
		close(got)
	}, func(err error) { fmt.Println("consume:", err) })
	if err != nil {
		fmt.Println(err)
		return
	}
	<-got
	sub.Drain()
	<-sub.Closed()
	if err := c.Flush(ctx); err != nil { // the ack has reached the server
		fmt.Println(err)
	}
	// Output: orders.eu order-1 {"qty":3}
}
