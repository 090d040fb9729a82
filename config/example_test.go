package config_test

import (
	"fmt"

	"github.com/jetsink/jetsink/config"
)

func ExampleParse() {
	file := []byte(`
nats:
  stream: TELEMETRY
postgres:
  table: metrics.readings
  batch: {max_rows: 2000, max_bytes: 2MiB}
`)
	cfg, err := config.Parse(file,
		[]string{"JETSINK_NATS_URL=nats://10.0.0.5:4222"}, // environment
		[]string{"postgres.batch.max_delay=50ms"})         // flags
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.NATS.URL, cfg.NATS.Stream)
	fmt.Println(cfg.Postgres.Table, cfg.Postgres.Batch.MaxRows, cfg.Postgres.Batch.MaxBytes, cfg.Postgres.Batch.MaxDelay)
	// Output:
	// nats://10.0.0.5:4222 TELEMETRY
	// metrics.readings 2000 2097152 50ms
}
