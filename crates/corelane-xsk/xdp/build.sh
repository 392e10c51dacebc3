#!/usr/bin/env bash
# Rebuilds the committed XDP object from source. The object is embedded by corelane-xsk, so users
# need no clang; `cargo test -p corelane-xsk --test xdp_object` rebuilds it into a temporary file
# and fails when the committed object is stale.
#
# Usage: crates/corelane-xsk/xdp/build.sh [OUT]   (default: crates/corelane-xsk/xdp/corelane.bpf.o)
# Needs: clang, llvm (llvm-strip), libbpf-dev, linux-libc-dev.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/corelane.bpf.o}
cd "$here"
# -ffile-prefix-map keeps the checkout path out of BTF line info, so the object is reproducible;
# llvm-strip -g drops DWARF and keeps the .BTF/.BTF.ext sections aya reads the maps from.
clang -O2 -g -target bpf -Wall -Werror \
  -I/usr/include/"$(uname -m)"-linux-gnu \
  -ffile-prefix-map="$here"=. \
  -c corelane.bpf.c -o "$out.tmp"
llvm-strip -g "$out.tmp" -o "$out"
rm -f "$out.tmp"
