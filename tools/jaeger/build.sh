#!/usr/bin/env bash
# Builds the Jaeger v2 all-in-one binary that tests/tracing_test.go runs, from
# the Go module proxy, once: the binary is cached outside the clone so that
# every CI clone and every checkout on this machine reuses it.
#
#   tools/jaeger/build.sh            # prints the binary's path
#
# Cold build: several minutes and ~1.3 GB of modules. The module lives in its
# own go.mod here (tools/jaeger), never in the main one.
set -euo pipefail
version=v1.76.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/jetsink/jaeger-${version}"
bin="${JETSINK_JAEGER_BIN:-$cache/jaeger}"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
cd "$(dirname "$0")"
mkdir -p "$(dirname "$bin")"
echo "jaeger: building ${version} into $bin (cold: several minutes)" >&2
go build -trimpath -o "$bin.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
mv "$bin.tmp" "$bin"
echo "$bin"
