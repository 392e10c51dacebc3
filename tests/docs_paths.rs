//! Every file or folder the docs name exists: a path in backquotes (`crates/corelane-rt/src/
//! driver.rs`, `steering/upgrade.rs`, `socket/`) must be a file or folder of the repository,
//! whole or as the tail of one (the docs name a crate's files from its `src/` when the crate is
//! clear from the sentence). A file that moves without its docs following fails here.

use std::collections::BTreeSet;
use std::path::Path;

/// The documents held to it.
const DOCS: [&str; 6] = [
    "README.md",
    "docs/ARCHITECTURE.md",
    "docs/LAYOUT.md",
    "docs/MEASURED.md",
    "docs/OPERATING.md",
    "docs/SECURITY.md",
];

/// Every file and folder under `dir`, relative to `root` (folders with a trailing `/`),
/// leaving out build output and version control.
fn tree(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "target" || name == ".git" {
            continue;
        }
        let rel = p
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        if p.is_dir() {
            out.insert(format!("{rel}/"));
            tree(root, &p, out);
        } else {
            out.insert(rel);
        }
    }
}

/// The backquoted words of `text` that read as a path of this repository: relative, made of
/// path characters, with at least one `/`, ending in a file name with an extension or in `/`.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (k, piece) in text.split('`').enumerate() {
        if k % 2 == 0 || piece.starts_with('/') || !piece.contains('/') {
            continue;
        }
        let plain = piece
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-/".contains(c));
        let last = piece.rsplit('/').next().unwrap_or("");
        let looks_like_file = last.contains('.') && !last.starts_with('.') && !last.ends_with('.');
        if plain && !piece.contains("//") && (looks_like_file || piece.ends_with('/')) {
            out.push(piece.to_string());
        }
    }
    out
}

fn exists(tree: &BTreeSet<String>, path: &str) -> bool {
    let tail = format!("/{path}");
    tree.iter().any(|p| p == path || p.ends_with(&tail))
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = BTreeSet::new();
    tree(root, root, &mut all);
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in DOCS {
        let Ok(text) = std::fs::read_to_string(root.join(doc)) else {
            missing.push(format!("{doc} itself"));
            continue;
        };
        for p in named_paths(&text) {
            checked += 1;
            if !exists(&all, &p) {
                missing.push(format!("{doc}: `{p}`"));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: is the reading right?"
    );
    assert!(
        missing.is_empty(),
        "paths the docs name that are not in the repository:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn a_path_is_read_from_backquotes_and_a_missing_one_is_found() {
    let text = "see `crates/corelane-rt/src/driver.rs`, `socket/`, `x / y`, `a.b`, `/proc/net`";
    assert_eq!(
        named_paths(text),
        ["crates/corelane-rt/src/driver.rs", "socket/"]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = BTreeSet::new();
    tree(root, root, &mut all);
    assert!(exists(&all, "src/driver.rs"));
    assert!(exists(&all, "steering/"));
    assert!(
        !exists(&all, "steering_upgrade.rs"),
        "moved to steering/upgrade.rs"
    );
    assert!(
        !exists(&all, "rt/src/driver.rs"),
        "a tail matches whole names only"
    );
}
