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
# 9464: /metrics, /healthz, /readyz (telemetry.listen)
EXPOSE 9464
ENTRYPOINT ["/jetsink"]
CMD ["run"]
