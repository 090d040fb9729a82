package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthURL is the URL healthcheck probes without --url.
const defaultHealthURL = "http://127.0.0.1:9464/readyz"

// newHealthcheckCmd probes a running jetsink's admin listener; container
// images without a shell use it as their health check.
func newHealthcheckCmd() *cobra.Command {
	var probe string
	var timeout time.Duration
	var live bool
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 if a running jetsink answers ready on its admin listener",
		Long: `Probe a running jetsink's /readyz and exit 0 if it answers 200 (ready), 1
otherwise, also for a bad command line (Docker reserves 2 in a health
check). Redirects are not followed and HTTP_PROXY is not used. With
--live it probes /healthz instead: 200 from when jetsink has set up the
stream, consumer and table until it exits, also while NATS or PostgreSQL
is away (the image's HEALTHCHECK uses it, so that an
orchestrator that kills unhealthy containers does not restart jetsink for
an outage a restart cannot mend; readiness stays on /readyz and in the
jetsink_ready metric).

Without --url it probes /readyz on the address in JETSINK_TELEMETRY_LISTEN
(telemetry.listen; 0.0.0.0, :: or no host is probed on 127.0.0.1; one it
cannot use, such as a port 0, exits 1),
so that a container run with -e JETSINK_TELEMETRY_LISTEN=0.0.0.0:9100 checks
port 9100; without that variable, ` + defaultHealthURL + `. Set and empty,
which turns the admin listener off, it exits 1 and says so. A
config file's telemetry.listen is not read: give --url when the file sets it.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{usageExitsFailed: "yes"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usageError{fmt.Errorf("healthcheck: --timeout %v: give a duration above 0, such as 3s", timeout)}
			}
			if !cmd.Flags().Changed("url") {
				listen, set := os.LookupEnv("JETSINK_TELEMETRY_LISTEN")
				u, err := healthURL(listen, set)
				if err != nil {
					// Exit 1, unhealthy: Docker reserves 2 in a health check.
					return fmt.Errorf("healthcheck: %w", err)
				}
				probe = u
				if live {
					probe = strings.TrimSuffix(u, "/readyz") + "/healthz"
				}
			} else if live {
				return usageError{errors.New("healthcheck: --live and --url: give one (--url names the path itself)")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, probe, nil)
			if err != nil {
				return fmt.Errorf("healthcheck: --url: %w", redactProbeError(probe, err))
			}
			// Not http.DefaultClient: a probe must ask the listener itself,
			// not follow a redirect or go through HTTP_PROXY.
			client := &http.Client{
				Transport:     &http.Transport{Proxy: nil},
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("healthcheck: %w", redactProbeError(probe, err))
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("healthcheck: %s: %s", resp.Status, strings.TrimSpace(string(body)))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&probe, "url", "", "URL to probe (default: /readyz on JETSINK_TELEMETRY_LISTEN, else "+defaultHealthURL+")")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&live, "live", false, "probe /healthz (alive) instead of /readyz (ready)")
	return cmd
}

// healthURL is the /readyz URL of the admin listener listen (host:port, as
// telemetry.listen takes it); without one (set false) defaultHealthURL. Set
// and empty, as jetsink reads JETSINK_TELEMETRY_LISTEN, the listener is off:
// an error. A listener on every address (no host, 0.0.0.0, ::) is probed on
// the loopback address of its family.
func healthURL(listen string, set bool) (string, error) {
	switch {
	case !set:
		return defaultHealthURL, nil
	case listen == "":
		return "", errors.New("JETSINK_TELEMETRY_LISTEN is empty, which turns jetsink's admin listener off: nothing answers a probe; give --url, or set it")
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("JETSINK_TELEMETRY_LISTEN %q: %w; give --url", listen, err)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("JETSINK_TELEMETRY_LISTEN %q names no fixed port; give --url", listen)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		// Also for ::, which Go listens on dual-stack (or on IPv4 alone
		// where IPv6 is off, as in many containers, and ::1 refuses).
		host = "127.0.0.1"
	}
	return (&url.URL{Scheme: "http", Host: net.JoinHostPort(host, port), Path: "/readyz"}).String(), nil
}

// redactProbeError is err, an error of parsing or requesting probe, with
// probe's user info (a token, a user name, a password) and its query and
// fragment (?token=...) shown as xxxxx: Go prints the URL whole when it
// does not parse, and with its user name and query (only a password
// hidden) when the request fails, so that a token given as
// http://TOKEN@host/readyz or http://host/readyz?token=TOKEN would reach
// the container's health log. Why the URL does not parse is not said
// either: Go quotes the part at fault (invalid URL escape "%zz", invalid
// port ":..."), which may be in the user info. Errors that are not a
// *url.Error are returned as they are.
func redactProbeError(probe string, err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	if ue.Op == "parse" {
		return quietError{fmt.Sprintf("parse %q: not a URL: check its %%-escapes, host and port", redactURL(probe)), err}
	}
	return fmt.Errorf("%s %q: %w", ue.Op, redactURL(probe), ue.Err)
}

// quietError says msg and unwraps to err, which it does not print: err
// quotes what msg must not show.
type quietError struct {
	msg string
	err error
}

func (e quietError) Error() string { return e.msg }
func (e quietError) Unwrap() error { return e.err }

// redactURL is raw with everything before the last @ of its user info and
// host replaced by xxxxx, and its query and fragment, after the first ? or
// # that follows, replaced by xxxxx, whether or not raw parses
// (telemetry's redactEndpoint does the same for the OTLP endpoint's user
// info): the user info may be a token, a query may carry one
// (?token=...), and a URL that does not parse may not say where its parts
// end. An @ further on (in the path or the query) redacts the host too,
// which is the safe side; a query's keys go with its values, as a key may
// be the token itself (?TOKEN).
func redactURL(raw string) string {
	prefix, rest := "", raw
	if i := strings.Index(raw, "://"); i >= 0 && !strings.ContainsAny(raw[:i], "/?#@") {
		prefix, rest = raw[:i+len("://")], raw[i+len("://"):]
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		prefix, rest = prefix+"xxxxx", rest[i:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 && i+1 < len(rest) {
		rest = rest[:i+1] + "xxxxx"
	}
	return prefix + rest
}
