package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetsink/jetsink/processor"
)

func newRunCmd() *cobra.Command {
	var cf configFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the processor until SIGTERM/SIGINT",
		Long: `Run the processor: pull from the durable consumer, map, COPY, COMMIT, ack.

On SIGTERM or SIGINT it drains: stops pulling, lets the rings empty, commits
and acks the last batch, and exits 0, within drain_timeout. A second signal,
or the drain timeout, exits at once with status 130; nothing that was not
committed has been acked, so JetStream redelivers it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load()
			if err != nil {
				return err
			}
			log := newLogger(cfg, os.Stderr)

			ctx := cmd.Context()
			intake, stopIntake := context.WithCancel(ctx)
			defer stopIntake()
			hard, stopHard := context.WithCancelCause(ctx)
			defer stopHard(nil)

			var mu sync.Mutex
			var timer *time.Timer // the drain's deadline, from the first signal
			defer func() {
				mu.Lock()
				defer mu.Unlock()
				if timer != nil {
					timer.Stop()
				}
			}()
			defer watchSignals(func(sig os.Signal) {
				log.Info("draining: stopped pulling, committing what is in flight", "signal", sig.String(), "drain_timeout", cfg.DrainTimeout)
				stopIntake()
				mu.Lock()
				defer mu.Unlock()
				timer = time.AfterFunc(cfg.DrainTimeout, func() {
					log.Warn("drain timeout: exiting now; uncommitted events stay unacked and will be redelivered", "drain_timeout", cfg.DrainTimeout)
					stopHard(fmt.Errorf("%w: drain took longer than drain_timeout %s", errAborted, cfg.DrainTimeout))
				})
			}, func(sig os.Signal) {
				log.Warn("second signal: exiting now; uncommitted events stay unacked and will be redelivered", "signal", sig.String())
				stopHard(fmt.Errorf("%w by a second signal (%s)", errAborted, sig))
			})()

			defer applyMemoryLimit(cfg.MemoryLimit, log)()
			p, err := processor.New(hard, cfg, log)
			if err != nil {
				if cause := context.Cause(hard); cause != nil && cause != context.Canceled {
					return cause // a second signal, or drain_timeout, while still connecting
				}
				return err
			}
			defer p.Close()
			err = p.Run(intake, hard)
			if cause := context.Cause(hard); cause != nil && cause != context.Canceled {
				return cause
			}
			if err != nil {
				return err
			}
			log.Info("drained: every event taken in is committed and acked")
			return nil
		},
	}
	cf.register(cmd.Flags())
	return cmd
}
