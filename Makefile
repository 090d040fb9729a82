# jetsink — make targets. `make test` is what CI runs.
GO      ?= go
PKGS    ?= ./...
# A test binary's limit: well above the slowest package's 6-8 minutes
# under -race on 2 cores (tests/: 6.1 to 7.1 in CI; over 10 once on a
# machine loaded by other builds, session 61; 9.8 with other tests
# running, session 62, its two-instance release test adding ~1), below CI's 20-minute
# budget, so that a hung test is named, with every goroutine's stack,
# before CI is killed.
TIMEOUT ?= 15m
# go test starts the packages' runs in the order it is given them, two at a
# time on 2 cores: the slowest first (tests/, 6-7 minutes, then consumer and
# sink, 4-5 each), so that the longest does not start last behind the
# others. Repeats are dropped.
ifeq ($(PKGS),./...)
TESTPKGS ?= ./tests ./consumer ./sink ./...
else
TESTPKGS ?= $(PKGS)
endif

.PHONY: all build test test-race test-natsgo vet vet-darwin race bench fmt clean jaeger alerts lint

all: build

# The commit, for jetsink --version when the build records no VCS
# information (GOFLAGS=-buildvcs=false, or no .git in a container build).
# Not JETSINK_*: jetsink takes every JETSINK_ variable for a setting.
BUILD_COMMIT ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null)

# CGO_ENABLED=0, as the Dockerfile builds what ships: a static binary
# with Go's own DNS resolver and user lookup, so that `jetsink bench`
# measures the binary users run (linking libc added ~0.8 MiB to a drain's
# peak RSS, session 63).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.buildCommit=$(BUILD_COMMIT)" -o bin/jetsink ./cmd/jetsink

vet:
	$(GO) vet $(PKGS)

# go vet of the macOS build, tests included: jetsink builds and runs there
# too (README: platforms), without the parts that are Linux's (CPU
# affinity, TCP_INFO, network namespaces: files named *_linux.go, with
# *_other.go beside them). The BSDs build from the same files.
vet-darwin:
	GOOS=darwin GOARCH=arm64 $(GO) vet $(PKGS)

# go vet, then every package's tests under the race detector, against real
# servers (embedded nats-server, throwaway PostgreSQL clusters, Jaeger v2),
# and beside them the consumer's tests again with nats.go's pull client
# (nats.pull_client: nats.go; the default is wire), its output shown whole
# when it ends, among the main pass's package lines, and go vet of the macOS
# build (vet-darwin); then the zero-allocation tests again in a normal build (the
# build users run).
# The two passes run together because the machine is idle much of the
# time: the tests wait on servers and timers (session 58 measured the CPUs
# 43% idle through the main pass, and the consumer's tests using a tenth
# of one core).
# -vet=off: the vet target has run every analyzer go test would.
test: vet jaeger alerts
	@$(MAKE) --no-print-directory -j3 test-race test-natsgo vet-darwin
	$(GO) test -count=1 -timeout 5m -run 'Alloc' ./ringq ./pipeline ./consumer ./consumer/wire ./telemetry

# The two passes of make test, which runs them together (make -j2: a
# failure of either fails it, once both have ended; an interrupt stops
# both). The second's output is kept until it ends, so that its lines do
# not cut into the first's.
test-race:
	$(GO) test -race -vet=off -count=1 -timeout $(TIMEOUT) $(TESTPKGS)

test-natsgo:
	@echo "JETSINK_TEST_PULL_CLIENT=nats.go $(GO) test -race -vet=off -count=1 -timeout $(TIMEOUT) ./consumer (its output when it ends)"
	@log=$$(mktemp); JETSINK_TEST_PULL_CLIENT=nats.go $(GO) test -race -vet=off -count=1 -timeout $(TIMEOUT) ./consumer >$$log 2>&1; \
	rc=$$?; echo "consumer with nats.go's pull client:"; cat $$log; rm -f $$log; exit $$rc

# Jaeger v2 for the tracing test: built once from the Go module proxy into
# ~/.cache/jetsink (a no-op when it is there; the first build takes minutes).
jaeger:
	@tools/jaeger/build.sh >/dev/null

# The Prometheus alerting rules, deploy/prometheus/alerts.yml: parsed and
# evaluated on made-up series by Prometheus's own packages, in a module of
# their own (they stay out of jetsink's go.mod). tests/alerts_test.go checks
# that jetsink serves every metric they name. No -race: the test is one
# goroutine evaluating rules, and instrumenting Prometheus's packages for
# the race detector only costs build time.
alerts:
	cd deploy/prometheus && $(GO) vet ./... && $(GO) test -vet=off -count=1 -timeout 5m ./...

# staticcheck, its version pinned here and installed outside jetsink's
# go.mod (go install pkg@version) into ~/.cache/jetsink, for this host,
# then run with the checks staticcheck.conf names on the Linux build and
# the macOS one (the *_other.go files), tests included. Not part of make
# test: its first build and a cold analysis take minutes on 2 cores.
STATICCHECK_DIR ?= $(HOME)/.cache/jetsink/staticcheck-v0.8.2
lint:
	@test -x $(STATICCHECK_DIR)/staticcheck || GOBIN=$(STATICCHECK_DIR) $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	$(STATICCHECK_DIR)/staticcheck -tests $(PKGS)
	GOOS=darwin GOARCH=arm64 $(STATICCHECK_DIR)/staticcheck -tests $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 $(PKGS)

fmt:
	gofmt -l -w .

clean:
	rm -rf bin
