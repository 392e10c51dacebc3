//! No import circle between the files of any crate: a module reaches the modules below it,
//! never one that reaches back. The graph is read from the source: every `crate::` path,
//! every `super::` sibling and every `use crate::{..}` group, a name re-exported with `pub use`
//! counting as the module that defines it; doc comments and the `tests` module at the end of a
//! file are left out. docs/ARCHITECTURE.md says which part owns what.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate's files: module path ("" for lib.rs, "tcp::conn") -> source.
type Files = BTreeMap<String, String>;

fn crate_files(src: &Path) -> Files {
    fn walk(root: &Path, dir: &Path, out: &mut Files) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                // Binaries are crates of their own.
                if p.file_name().is_some_and(|n| n != "bin") {
                    walk(root, &p, out);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p
                    .strip_prefix(root)
                    .expect("under the root")
                    .with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("lib" | "main" | "mod")
                ) {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&p).expect("a source file");
                out.insert(parts.join("::"), text);
            }
        }
    }
    let mut files = Files::new();
    walk(src, src, &mut files);
    files
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests`.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    if let Some(at) = out.find("#[cfg(test)]\nmod tests {") {
        out.truncate(at);
    }
    out
}

fn ident_path(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end].trim_end_matches(':')
}

/// The text inside the braces that open at `s[0]`, balanced.
fn braced(s: &str) -> &str {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &s[1..i];
                }
            }
            _ => {}
        }
    }
    ""
}

/// Items of a `{a, b::{c, d}, e as f}` group at its top level.
fn group_items(g: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in g.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(g[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(g[start..].trim());
    items.retain(|s| !s.is_empty());
    items
}

struct Graph {
    mods: BTreeSet<String>,
    /// module -> (re-exported name -> the module that defines it)
    reexports: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    /// The longest module that is a prefix of `path`, and what follows it.
    fn longest<'a>(&self, parts: &'a [&'a str]) -> Option<(String, &'a [&'a str])> {
        (0..=parts.len()).rev().find_map(|i| {
            let m = parts[..i].join("::");
            self.mods.contains(&m).then_some((m, &parts[i..]))
        })
    }

    fn resolve(&self, path: &str) -> Option<String> {
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let (mut m, mut rest) = self.longest(&parts)?;
        for _ in 0..8 {
            let Some(next) = rest
                .first()
                .and_then(|n| self.reexports.get(&m).and_then(|r| r.get(*n)))
            else {
                break;
            };
            m = next.clone();
            rest = &rest[1..];
        }
        Some(m)
    }
}

/// Every circle of two or more modules, each sorted.
fn circles(files: &Files) -> Vec<Vec<String>> {
    let codes: BTreeMap<&String, String> = files.iter().map(|(m, t)| (m, code(t))).collect();
    let mut g = Graph {
        mods: files.keys().cloned().collect(),
        reexports: BTreeMap::new(),
    };
    for (m, src) in &codes {
        for (at, _) in src.match_indices("use ") {
            let before = src[..at].trim_end();
            if !(before.ends_with("pub") || before.ends_with(')') && before.contains("pub(")) {
                continue;
            }
            let stmt = &src[at + 4..];
            let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
            let (crate_rel, body) = match stmt.strip_prefix("crate::") {
                Some(b) => (true, b),
                None => (false, stmt.strip_prefix("self::").unwrap_or(stmt)),
            };
            let (base, names): (&str, Vec<&str>) = match body.find("::{") {
                Some(b) => (&body[..b], group_items(braced(&body[b + 2..]))),
                None => match body.rsplit_once("::") {
                    Some((b, n)) => (b, vec![n]),
                    None => continue,
                },
            };
            let full = if crate_rel || m.is_empty() {
                base.to_string()
            } else {
                format!("{m}::{base}")
            };
            let parts: Vec<&str> = full.split("::").collect();
            let Some((target, _)) = g.longest(&parts) else {
                continue;
            };
            if &target == *m {
                continue;
            }
            for n in names {
                let n = n.rsplit(" as ").next().unwrap_or(n).trim();
                if !n.is_empty() && n != "self" && !n.contains('{') {
                    g.reexports
                        .entry((*m).clone())
                        .or_default()
                        .insert(n.to_string(), target.clone());
                }
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, src) in &codes {
        let mut add = |t: Option<String>| {
            if let Some(t) = t.filter(|t| t != *m && !t.is_empty()) {
                edges.entry((*m).clone()).or_default().insert(t);
            }
        };
        for (at, _) in src.match_indices("crate::") {
            let preceded = src[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            if !preceded {
                add(g.resolve(ident_path(&src[at + 7..])));
            }
        }
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        for (at, _) in src.match_indices("super::") {
            let name = ident_path(&src[at + 7..]);
            let name = name.split("::").next().unwrap_or("");
            let path = if parent.is_empty() {
                name.to_string()
            } else {
                format!("{parent}::{name}")
            };
            add(g.resolve(&path));
        }
        for (at, _) in src.match_indices("use crate::{") {
            for item in group_items(braced(&src[at + 11..])) {
                add(g.resolve(item.split("::{").next().unwrap_or(item)));
            }
        }
    }
    strongly_connected(&g.mods, &edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    nodes: &BTreeSet<String>,
    edges: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.edges.get(v) {
            for w in ws {
                if !t.index.contains_key(w.as_str()) {
                    visit(t, w);
                    let lw = t.low[w.as_str()];
                    let lv = t.low[v].min(lw);
                    t.low.insert(v, lv);
                } else if t.on.contains(w.as_str()) {
                    let lv = t.low[v].min(t.index[w.as_str()]);
                    t.low.insert(v, lv);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            comp.sort();
            t.out.push(comp);
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in nodes {
        if !t.index.contains_key(n.as_str()) {
            visit(&mut t, n);
        }
    }
    t.out
}

fn roots() -> Vec<PathBuf> {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![top.join("src")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(top.join("crates"))
        .expect("the crates directory")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    roots.extend(crates);
    roots
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    let mut modules = 0;
    for root in roots() {
        let files = crate_files(&root);
        modules += files.len();
        for c in circles(&files) {
            found.push(format!("{}: {}", root.display(), c.join(", ")));
        }
    }
    assert!(modules > 100, "the module graph was read ({modules} files)");
    assert!(
        found.is_empty(),
        "import circles (a module reaches one that reaches back):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_circle_is_found_through_groups_super_and_re_exports() {
    let files = |list: &[(&str, &str)]| -> Files {
        list.iter()
            .map(|(m, t)| (m.to_string(), t.to_string()))
            .collect()
    };
    // lane -> control (a group), control -> steward (through lib's re-export), steward ->
    // lane (a path in code). A doc comment and the tests module are not imports.
    let circle = files(&[
        ("", "mod lane;\npub use steward::Steer;\n"),
        ("lane", "use crate::{lock, control::{Shared}};\n"),
        ("control", "pub(crate) struct S(crate::Steer);\n"),
        ("steward", "fn f() { crate::lane::x(); }\n"),
        (
            "lock",
            "/// see crate::lane\nfn g() {}\n#[cfg(test)]\nmod tests {\n use crate::control;\n}\n",
        ),
    ]);
    assert_eq!(
        circles(&circle),
        vec![vec!["control".to_string(), "lane".into(), "steward".into()]]
    );
    let tcp = files(&[
        ("tcp", "mod conn;\nmod ecn;\n"),
        ("tcp::conn", "struct C { e: super::ecn::Ecn }\n"),
        ("tcp::ecn", "use super::conn::C;\n"),
    ]);
    assert_eq!(
        circles(&tcp),
        vec![vec!["tcp::conn".to_string(), "tcp::ecn".into()]]
    );
    let none = files(&[
        ("", "mod a;\nmod b;\n"),
        ("a", "use crate::b;\n"),
        ("b", "// crate::a\nfn f() {}\n"),
    ]);
    assert!(circles(&none).is_empty());
}
