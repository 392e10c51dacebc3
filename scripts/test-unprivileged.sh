#!/usr/bin/env bash
# What needs neither root nor a device, run as an ordinary user: corelane-rt's own tests (the
# runtime's host seam, the two sides of an upgrade, the whole-runtime simulation, the lab) and
# a ported service's tests in `corelane::lab` (tests/lab_service.rs), and QUIC and HTTP/3 in
# the lab (tests/quic_lab.rs, tests/h3_lab.rs). Under the `checked`
# profile (debug assertions and overflow checks on) unless another is named; as root, the test
# binaries run as user nobody.
#
#   bash scripts/test-unprivileged.sh [PROFILE]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-checked}
# The executable cargo builds for the tests named by the arguments.
test_exe() {
  cargo test --locked --profile "$profile" "$@" --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4
}
rt=$(test_exe -p corelane-rt --lib)
service=$(test_exe -p corelane --test lab_service)
quic=$(test_exe -p corelane --test quic_lab)
h3=$(test_exe -p corelane --features h3 --test h3_lab)
if [ -z "$rt" ] || [ -z "$service" ] || [ -z "$quic" ] || [ -z "$h3" ]; then
  echo "test-unprivileged: the test binaries were not built" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  "$rt"
  "$quic"
  "$h3"
  exec "$service" lab_
fi
# Root: copies nobody can read and run, wherever the checkout is.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$rt" "$dir/corelane-rt-tests"
cp "$service" "$dir/lab-service-tests"
cp "$quic" "$dir/quic-lab-tests"
cp "$h3" "$dir/h3-lab-tests"
chmod 755 "$dir" "$dir/corelane-rt-tests" "$dir/lab-service-tests" "$dir/quic-lab-tests" \
  "$dir/h3-lab-tests"
cd "$dir"
# The service's lab tests only (its last test serves on a veth, as root).
for t in corelane-rt-tests quic-lab-tests h3-lab-tests "lab-service-tests lab_"; do
  # shellcheck disable=SC2086 # the binary and its filter
  setpriv --reuid 65534 --regid 65534 --clear-groups env -i PATH=/usr/bin:/bin HOME="$dir" \
    CORELANE_RUNTIME_SIM_SEEDS="${CORELANE_RUNTIME_SIM_SEEDS:-10000}" ./$t
done
