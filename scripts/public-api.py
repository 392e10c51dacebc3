#!/usr/bin/env python3
"""The public API of the `corelane` crate, as rustdoc renders it, one line per declaration.

Reads the HTML `cargo doc --no-deps` wrote under target/doc/corelane (the facade users add,
with what it re-exports inlined) and prints, item by item in the order of their paths, every item's declaration and every
inherent method, field and variant, and the header of every trait it implements (blanket
implementations, which come from the standard library, and the trait's own methods left
out), as plain text:

    corelane::Runtime | pub fn builder(ifname: &str) -> Builder

Runs on stable Rust (no rustdoc JSON). Usage:

    scripts/public-api.py                 # print the API
    scripts/public-api.py --check FILE    # differ from FILE: print the diff, exit 1
    scripts/public-api.py --write FILE    # record the API in FILE

A change to the API, added or removed, shows as a diff against docs/public-api.txt in CI;
record it with --write when it is meant.
"""

import argparse
import difflib
import html
import os
import re
import sys

DOC = os.path.join("target", "doc", "corelane")
KINDS = ("struct", "enum", "trait", "fn", "type", "constant", "macro", "static", "union")


def text(fragment):
    """The text of an HTML fragment, whitespace collapsed; a link to a corelane type named by
    its full path (rustdoc shows the bare name), so that two types of one name stay apart
    and a type of an inner crate the facade does not re-export shows as such."""
    fragment = re.sub(
        r'<a [^>]*title="\w+ (corelane(?:_\w+)?(?:::\w+)+)"[^>]*>[^<]*</a>',
        lambda m: m.group(1),
        fragment,
    )
    # A long struct's fields fold behind a toggle whose label is not part of the API.
    fragment = re.sub(r"<summary[^>]*>.*?</summary>", "", fragment, flags=re.S)
    fragment = re.sub(r"<[^>]+>", "", fragment)
    return re.sub(r"\s+", " ", html.unescape(fragment)).strip()


def item_path(rel):
    """`net/struct.TcpStream.html` -> `corelane::net::TcpStream`."""
    parts = rel[: -len(".html")].split(os.sep)
    kind, _, name = parts[-1].partition(".")
    return "::".join(["corelane"] + parts[:-1] + [name]), kind


def lines_of(page):
    # Blanket implementations come from the standard library's generic impls: not ours.
    cut = page.find('id="blanket-implementations"')
    if cut >= 0:
        page = page[:cut]
    out = []
    decl = re.search(r'<pre class="rust item-decl"><code>(.*?)</code></pre>', page, re.S)
    if decl:
        # Multi-line declarations (an enum's variants, a struct's public fields) one line
        # each, so that a diff points at the member that changed.
        for line in decl.group(1).splitlines():
            line = text(line)
            if line and line not in ("{", "}", "},"):
                out.append(line.rstrip(","))
    # Inherent items in full; of trait implementations only the headers (the methods are
    # the trait's); of the auto traits those every Rust release has (a newer one adds more).
    trait_at = page.find('id="trait-implementations"')
    for m in re.finditer(r'<h([34]) class="code-header">(.*?)</h[34]>', page, re.S):
        line = text(m.group(2))
        if trait_at >= 0 and m.start() > trait_at and m.group(1) == "4":
            continue
        auto = re.match(r"impl !?(\w+) for ", line)
        if auto and auto.group(1) in ("Freeze", "UnsafeUnpin"):
            continue
        out.append(line)
    # In the page's order (rustdoc sorts implementations and methods itself), a line that
    # repeats the one before it once.
    return [l for i, l in enumerate(out) if i == 0 or out[i - 1] != l]


def api(doc):
    if not os.path.isdir(doc):
        sys.exit(f"{doc} does not exist: run `cargo doc --workspace --no-deps` first")
    pages = []
    for root, _, files in os.walk(doc):
        for f in files:
            if f.endswith(".html") and f.split(".")[0] in KINDS:
                full = os.path.join(root, f)
                pages.append((item_path(os.path.relpath(full, doc)), full))
    lines = []
    for (path, kind), full in sorted(pages):
        with open(full, encoding="utf-8") as fh:
            page = fh.read()
        lines.append(f"{path} | {kind}")
        lines.extend(f"{path} | {line}" for line in lines_of(page))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", metavar="FILE")
    p.add_argument("--write", metavar="FILE")
    p.add_argument("--doc", default=DOC)
    a = p.parse_args()
    now = api(a.doc)
    if a.write:
        with open(a.write, "w", encoding="utf-8") as fh:
            fh.write("\n".join(now) + "\n")
        print(f"{len(now)} lines written to {a.write}")
    elif a.check:
        with open(a.check, encoding="utf-8") as fh:
            before = fh.read().splitlines()
        if before != now:
            sys.stdout.writelines(
                l + "\n"
                for l in difflib.unified_diff(before, now, a.check, "the API now", lineterm="")
            )
            print(
                f"\nThe public API of corelane differs from {a.check}. If the change is meant, "
                f"record it: python3 scripts/public-api.py --write {a.check} (after removing "
                f"an item, rm -rf {a.doc} and rebuild the docs first: cargo leaves its old "
                f"pages there)",
                file=sys.stderr,
            )
            sys.exit(1)
        print(f"public API unchanged ({len(now)} lines, {a.check})")
    else:
        print("\n".join(now))


if __name__ == "__main__":
    main()
