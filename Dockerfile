# syntax=docker/dockerfile:1
# Multi-stage build: a static jetsink binary on a distroless base (~37 MB).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/jetsink ./cmd/jetsink

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/jetsink /jetsink
USER nonroot:nonroot
# 9464: /metrics, /healthz, /readyz (telemetry.listen). Its default,
# 127.0.0.1:9464, is out of reach from outside the container: run with
# -e JETSINK_TELEMETRY_LISTEN=0.0.0.0:9464 (docker-compose.yml does) to
# publish it. Not set here, as a variable would override a config file's
# telemetry.listen.
EXPOSE 9464
ENTRYPOINT ["/jetsink"]
CMD ["run"]
