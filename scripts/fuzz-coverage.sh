#!/usr/bin/env bash
# The protocol crate's fuzz targets, coverage-guided: corelane-fuzz built with LLVM's
# SanitizerCoverage (stable Rust accepts these flags), in its own target directory so the
# instrumented build never mixes with the normal one. Arguments go to corelane-fuzz, e.g.
#   scripts/fuzz-coverage.sh --seconds 600
#   scripts/fuzz-coverage.sh --target node --seconds 60 --found target/fuzz-found
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=3 -Cllvm-args=-sanitizer-coverage-trace-pc-guard"
# With --target, RUSTFLAGS reach only what runs on the target: build scripts and proc macros are
# built without the instrumentation (they would not link: the callbacks live in corelane-fuzz).
host=$(rustc -vV | sed -n 's/^host: //p')
exec cargo run --locked --release --target "$host" --target-dir target/coverage -p corelane-fuzz -- "$@"
