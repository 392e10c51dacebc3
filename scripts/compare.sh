#!/usr/bin/env bash
# corelane against the kernel TCP stack on one veth pair, same CPUs, same load: installs what it
# needs, builds, runs every case with the setups alternating, and writes
# target/compare/compare.{md,json,png}. Run as root.
#
# Usage: scripts/compare.sh [compare flags, e.g. --repeat 5 --seconds 3; --help lists them]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --locked --release -p corelane-bench --bin compare
exec target/release/compare "$@"
