#!/usr/bin/env bash
# corelane-rt's own tests as an ordinary user: the runtime's host seam, the two sides of an
# upgrade and the whole-runtime simulation need neither root nor a device. Under the `checked`
# profile (debug assertions and overflow checks on) unless another is named; as root, the test
# binary runs as user nobody.
#
#   bash scripts/test-unprivileged.sh [PROFILE]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-checked}
exe=$(cargo test --locked --profile "$profile" -p corelane-rt --lib --no-run \
  --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4)
if [ -z "$exe" ]; then
  echo "test-unprivileged: no test binary of corelane-rt was built" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  exec "$exe"
fi
# Root: a copy nobody can read and run, wherever the checkout is.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$exe" "$dir/corelane-rt-tests"
chmod 755 "$dir" "$dir/corelane-rt-tests"
cd "$dir"
setpriv --reuid 65534 --regid 65534 --clear-groups env -i PATH=/usr/bin:/bin HOME="$dir" \
  CORELANE_RUNTIME_SIM_SEEDS="${CORELANE_RUNTIME_SIM_SEEDS:-10000}" ./corelane-rt-tests
