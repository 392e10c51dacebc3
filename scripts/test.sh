#!/usr/bin/env bash
# The whole test suite, as root on Debian: installs what it needs, checks formatting and lints,
# then runs every test (the privileged ones build veth pairs in network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests' binaries without debug info (Cargo.toml's release profile keeps it, for profiling
# the benches): some 150 of them, each about a seventh of its size with it. The symbol table
# stays, so a panic's backtrace still names its functions.
export CARGO_PROFILE_RELEASE_DEBUG=0
# In CI each phase's build output goes once no later phase reads it: with the above, target/
# peaks at 2.5 GB where it took 9.5 GB (a CI machine's free disk varies; a full one fails the
# link). Elsewhere it stays, for the next run.
done_with() {
  if [ "${CI:-}" = true ]; then
    rm -rf "$@"
  fi
}
bash scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
# The facade's public API against its record: a change shows as a diff (record a meant one
# with --write).
python3 scripts/public-api.py --check docs/public-api.txt
# The runtime's optional parts, as docs.rs builds them (their links checked too).
RUSTDOCFLAGS="-D warnings" cargo doc --locked -p corelane-rt --features quic,h3,hyper,tonic,sim \
  --no-deps --quiet
done_with target/debug target/doc
# Release mode: the end-to-end tests push 64 MiB through the stack. `cargo test` on the whole
# workspace also builds the examples the privileged tests run.
# CORELANE_STRICT=1: a frame any runtime builds over its MTU panics (a bug) instead of being
# counted and dropped.
CORELANE_STRICT=1 cargo test --locked --release --workspace --features corelane/h3
# The protocol crate again with debug assertions and overflow checks on (Cargo.toml's `checked`
# profile): the asserts in tcp/ring.rs and tcp/wire.rs and every subtraction on sequence
# space and the scoreboard are checked under the conformance scripts and the simulation's
# seeds (about half a minute; 8 seeds a scenario here, the release run above takes 180).
CORELANE_SIM_SEEDS=8 cargo test --locked --profile checked -p corelane-stack
# The frame ledger's and the exchange's invariants are debug assertions too: the frame crate and
# the AF_XDP crate's own tests under the same profile (the upgrade simulation with 1,000 seeds,
# the veth tests as root).
CORELANE_UPGRADE_SIM_SEEDS=1000 cargo test --locked --profile checked -p corelane-frame \
  -p corelane-xsk --lib
# corelane-rt's tests as an ordinary user (nobody), under the same profile: the runtime's host
# seam, both sides of an upgrade and the whole-runtime simulation (10,000 seeds) need neither
# root nor a device.
bash scripts/test-unprivileged.sh
done_with target/checked
# The fuzz targets coverage-guided for a few seconds each (SanitizerCoverage on stable Rust, its
# own target directory): fails on a panic, or if the instrumentation took fewer edges than the
# corpus alone takes (400 to 2,300 per target), i.e. if it stopped working. Long runs:
# scripts/fuzz-coverage.sh --seconds 600.
bash scripts/fuzz-coverage.sh --seconds 5 --min-edges 300
done_with target/coverage
# README's build-dependency list, checked in a minimal Debian root that has nothing else.
bash scripts/clean-build-check.sh
done_with target/clean-build
# Every crate a user depends on packages and builds from its package alone (what `cargo add`
# from a registry gets: corelane-xsk's package carries the compiled XDP program).
# Cargo unpacks the packages it verifies against into a registry of its own, named by the
# checkout's path, and neither unpacks nor rebuilds a version it already has: a checkout
# packaged before at the same path and version would be verified against its old sources or
# their old build. Those unpacked copies go first (crates.io's are left alone), and the
# verification builds in a target directory of its own, made afresh.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/corelane* target/package-verify
cargo package --workspace --exclude corelane-bench --exclude corelane-fuzz --locked \
  --target-dir target/package-verify
done_with target/package-verify
# Zero-copy mode: a Debian 6.18 guest under QEMU's software emulation, its virtio-net bound with
# XDP_ZEROCOPY (the kernel cached in /var/cache/corelane-vm after the first run; a minute or two).
bash scripts/zerocopy-vm.sh
