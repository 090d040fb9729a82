# syntax=docker/dockerfile:1
# Multi-stage build: a static jetsink binary on a distroless base (~37 MB).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# For jetsink --version: docker build --build-arg COMMIT=$(git describe --always --dirty)
# (docker-compose.yml passes BUILD_COMMIT from the environment)
ARG COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.buildCommit=${COMMIT}" -o /out/jetsink ./cmd/jetsink

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/jetsink /jetsink
# distroless's nonroot user, by number: Kubernetes' runAsNonRoot can only
# verify a numeric user.
USER 65532:65532
# 9464: /metrics, /healthz, /readyz (telemetry.listen). Its default,
# 127.0.0.1:9464, is out of reach from outside the container: run with
# -e JETSINK_TELEMETRY_LISTEN=0.0.0.0:9464 (docker-compose.yml does) to
# publish it. Not set here, as a variable would override a config file's
# telemetry.listen.
EXPOSE 9464
# Runs inside the container, so the default 127.0.0.1:9464 is reachable; it
# follows JETSINK_TELEMETRY_LISTEN (give --url if a config file moves it).
# --live: /healthz, alive, not /readyz: an orchestrator that restarts
# unhealthy containers must not restart jetsink for a NATS or PostgreSQL
# outage (a restart cannot mend it, and sends the events in flight back).
# /healthz answers once jetsink has set up the stream, consumer and table:
# 5 minutes for that (an index built on a large table, a lock waited for).
HEALTHCHECK --interval=5s --timeout=3s --start-period=5m --retries=12 CMD ["/jetsink", "healthcheck", "--live", "--timeout", "2.5s"]
# `docker stop` waits 10 s by default, less than drain_timeout (30 s) and
# the ~3 s of telemetry after it: run with --stop-timeout 45.
ENTRYPOINT ["/jetsink"]
CMD ["run"]
