#!/usr/bin/env bash
# Checks the package list README.md gives under "Building it into your crate": a minimal Debian
# bookworm root (debootstrap) with only those packages, and Rust bind-mounted from this machine,
# builds and links a fresh crate that depends on corelane. A package missing from the list fails
# here, not on a user's machine. Run as root; takes a few minutes (the root is cached under
# target/clean-build; CLEAN_BUILD_FRESH=1 starts over).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "clean-build-check: run as root (debootstrap and chroot need it)" >&2
  exit 1
fi
repo=$(pwd)
work=$repo/target/clean-build
root=$work/root
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# The list, read from README.md so the two cannot drift apart.
pkgs=$(awk '/^<!-- build-deps -->/{on=1; next} /^<!-- \/build-deps -->/{on=0} on' README.md |
  sed -n '/apt-get install/,/^```/p' | grep -v '^```' | sed 's/apt-get install//; s/\\//g' | xargs)
if [ -z "$pkgs" ]; then
  echo "clean-build-check: no package list between <!-- build-deps --> markers in README.md" >&2
  exit 1
fi
echo "clean-build-check: README's list: $pkgs"

if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
stamp="$root/.corelane-$(echo "$pkgs" | sha256sum | cut -c1-16)"
if [ "${CLEAN_BUILD_FRESH:-0}" = 1 ] || [ ! -e "$stamp" ]; then
  rm -rf "$root"
  mkdir -p "$work"
  echo "clean-build-check: debootstrap --variant=minbase bookworm ($mirror)"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # shellcheck disable=SC2086
  chroot "$root" env DEBIAN_FRONTEND=noninteractive sh -c \
    "apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs" \
    >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
  touch "$stamp"
fi

rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
toolchain=$(rustup show active-toolchain | cut -d' ' -f1)
rustc_bin=$(rustup which rustc)
toolchain_dir=$(dirname "$(dirname "$rustc_bin")")

# A crate as a user's: depends on corelane by path, calls into it so everything links.
app=$root/build/app
rm -rf "$app"
mkdir -p "$app/src" "$root/src" "$root/rust" "$root/cargo-home"
cat >"$app/Cargo.toml" <<TOML
[package]
name = "app"
version = "0.1.0"
edition = "2024"

[dependencies]
corelane = { path = "/src" }
tokio = { version = "1", features = ["io-util"] }
TOML
cat >"$app/src/main.rs" <<'RS'
fn main() {
    match corelane::Runtime::builder("lo").addr("10.99.0.1/24").build() {
        Ok(rt) => println!("{}", rt.describe()),
        Err(e) => println!("corelane linked; building a runtime here says: {e}"),
    }
}
RS
cp Cargo.lock "$app/Cargo.lock"

echo "clean-build-check: building a crate that depends on corelane, inside the clean root"
# Private mounts: they vanish with this process. The toolchain and the registry cache come from
# this machine (Rust is the one prerequisite README names besides the list).
unshare --mount --propagation private sh -eu -c "
  mount --bind '$repo' '$root/src'; mount -o remount,bind,ro '$root/src'
  mount --bind '$toolchain_dir' '$root/rust'; mount -o remount,bind,ro '$root/rust'
  mount --bind '$cargo_home' '$root/cargo-home'
  mount -t proc proc '$root/proc'
  chroot '$root' env -i PATH=/rust/bin:/usr/bin:/bin HOME=/root CARGO_HOME=/cargo-home \
    CARGO_TARGET_DIR=/build/target CARGO_TERM_COLOR=never \
    sh -c 'cd /build/app && cargo build --quiet && ./../target/debug/app'
" 2>&1 | tee "$work/build.log" | tail -25
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo "clean-build-check: FAILED: a crate depending on corelane does not build with README's list" >&2
  echo "  (whole log: $work/build.log; toolchain $toolchain)" >&2
  exit 1
fi
echo "clean-build-check: ok (README's list builds and links corelane on a minimal bookworm)"
