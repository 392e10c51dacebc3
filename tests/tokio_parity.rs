//! Parity with tokio, checked mechanically: every documentation example tokio ships for
//! `TcpListener`, `TcpStream`, `TcpSocket`, `UdpSocket` and the split halves (read from tokio's
//! own source, the version in Cargo.lock) is compiled against `corelane::net` with only the
//! imports changed. Each one must compile, except the few in `DIFFERENCES`, which must still fail
//! (so the list, and README's porting table that has a row for each, stays true). Needs no
//! root: it only compiles (`cargo check --offline`, in a crate of its own under the test's
//! scratch directory).

mod tokio_source;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tokio_source::{corelane_imports, tokio_source};

/// tokio's files whose examples are checked.
const FILES: &[&str] = &[
    "net/tcp/listener.rs",
    "net/tcp/stream.rs",
    "net/tcp/socket.rs",
    "net/tcp/split.rs",
    "net/tcp/split_owned.rs",
    "net/udp.rs",
];

/// The examples that do not compile against corelane, by `file: item` (the item the example
/// documents), and why; each is a row of README's porting table.
const DIFFERENCES: &[(&str, &str)] = &[
    ("net/tcp/listener.rs: from_std", KERNEL_SOCKET),
    ("net/tcp/listener.rs: into_std", KERNEL_SOCKET),
    ("net/tcp/stream.rs: from_std", KERNEL_SOCKET),
    ("net/tcp/stream.rs: into_std", KERNEL_SOCKET),
    ("net/tcp/socket.rs: from_std_stream", KERNEL_SOCKET),
    ("net/udp.rs: from_std", KERNEL_SOCKET),
    ("net/udp.rs: into_std", KERNEL_SOCKET),
];

const KERNEL_SOCKET: &str = "a kernel socket cannot become a corelane one, nor the reverse: \
                             corelane's sockets live in its own stack";

/// One documentation example: its key (`file: item`) and its code as a test would run it.
struct Example {
    key: String,
    code: String,
}

#[test]
fn tokios_documentation_examples_compile_against_corelane_net() -> Result<(), String> {
    let tokio = tokio_source()?;
    let mut examples = Vec::new();
    for f in FILES {
        let text = std::fs::read_to_string(tokio.join("src").join(f))
            .map_err(|e| format!("{}: {e}", tokio.join("src").join(f).display()))?;
        examples.extend(extract(f, &text));
    }
    assert!(
        examples.len() >= 80,
        "only {} examples found in {}",
        examples.len(),
        tokio.display()
    );
    for e in &examples {
        assert!(
            e.code.contains("corelane::net"),
            "{}: does not use corelane's sockets:\n{}",
            e.key,
            e.code
        );
        let grouped = e
            .code
            .lines()
            .any(|l| l.trim_start().starts_with("use tokio::{") && l.contains("net"));
        assert!(
            !grouped,
            "{}: a grouped import of tokio::net left:\n{}",
            e.key, e.code
        );
    }
    for (key, _) in DIFFERENCES {
        assert!(
            examples.iter().any(|e| &e.key == key),
            "{key} is no longer among tokio's examples: take it out of DIFFERENCES"
        );
    }
    let (differ, same): (Vec<&Example>, Vec<&Example>) = examples
        .iter()
        .partition(|e| DIFFERENCES.iter().any(|(k, _)| *k == e.key));
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tokio-parity");
    // Every example but the listed differences compiles.
    let failed = check(&scratch, &same)?;
    assert!(
        failed.is_empty(),
        "tokio's examples that do not compile against corelane::net (fix the API, or add a \
         row to README's porting table and to DIFFERENCES):\n{}",
        failed
            .iter()
            .map(|(k, e)| format!("--- {k}\n{e}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Each listed difference still fails, each on its own.
    let failed = check(&scratch, &differ)?;
    let compiled: Vec<&str> = differ
        .iter()
        .map(|e| e.key.as_str())
        .filter(|k| !failed.contains_key(*k))
        .collect();
    assert!(
        compiled.is_empty(),
        "these now compile: take them out of DIFFERENCES and README's porting table: {compiled:?}"
    );
    Ok(())
}

/// The examples of one of tokio's files (fenced Rust in `///` comments, not `ignore`d and not
/// `compile_fail`), as rustdoc would build them, with `tokio::net` replaced by `corelane::net`.
fn extract(file: &str, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let Some(fence) = l.strip_prefix("/// ```") else {
            i += 1;
            continue;
        };
        let rust =
            !(fence.contains("ignore") || fence.contains("compile_fail") || fence.contains("text"));
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("/// ```") {
            body.push(doc_line(lines[i]));
            i += 1;
        }
        i += 1;
        if !rust {
            continue;
        }
        // The item the example documents: the next `fn` or `struct` after it.
        let item = lines[i.min(lines.len())..]
            .iter()
            .find_map(|l| item_name(l))
            .unwrap_or_default();
        let n = seen.entry(item.clone()).or_default();
        *n += 1;
        let key = if *n == 1 {
            format!("{file}: {item}")
        } else {
            format!("{file}: {item} #{n}")
        };
        out.push(Example {
            key,
            code: as_test(&body),
        });
    }
    out
}

/// A line of a `///` comment as the example's source: rustdoc's hidden `# ` lines shown.
fn doc_line(l: &str) -> String {
    let l = l.trim_start();
    let l = l.strip_prefix("///").unwrap_or(l);
    let l = l.strip_prefix(' ').unwrap_or(l);
    let code = l.trim_start();
    let indent = &l[..l.len() - code.len()];
    if code == "#" {
        String::new()
    } else if let Some(rest) = code.strip_prefix("# ") {
        format!("{indent}{rest}")
    } else {
        l.to_string()
    }
}

/// `name` when the line declares `fn name` or `struct name`.
fn item_name(l: &str) -> Option<String> {
    let l = l.trim_start();
    if l.starts_with("//") {
        return None;
    }
    let after = l
        .split_once("fn ")
        .or_else(|| l.split_once("struct "))
        .map(|(_, r)| r)?;
    let name: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The example as rustdoc compiles it (wrapped in `fn main` unless it has one), with corelane's
/// imports; `#[tokio::main]` dropped (the example is compiled, never run).
fn as_test(body: &[String]) -> String {
    let code: Vec<String> = body
        .iter()
        .filter(|l| l.trim() != "#[tokio::main]")
        .map(|l| corelane_imports(l))
        .collect();
    let code = code.join("\n");
    if code.contains("fn main(") {
        code
    } else {
        format!("fn main() {{\n{code}\n}}")
    }
}

/// Compiles `examples` as the modules of one crate under `scratch`; returns the examples that
/// failed, each with its first error.
fn check(scratch: &Path, examples: &[&Example]) -> Result<BTreeMap<String, String>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(scratch.join("src")).map_err(|e| e.to_string())?;
    let manifest = format!(
        "[package]\nname = \"tokio-parity\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         publish = false\n\n[dependencies]\ncorelane = {{ path = {:?} }}\nbytes = \"1\"\n\
         tokio = {{ version = \"1\", features = [\"rt\", \"macros\", \"io-util\", \"net\", \
         \"time\", \"sync\"] }}\n\n[workspace]\n",
        root.display().to_string()
    );
    std::fs::write(scratch.join("Cargo.toml"), manifest).map_err(|e| e.to_string())?;
    std::fs::copy(root.join("Cargo.lock"), scratch.join("Cargo.lock"))
        .map_err(|e| e.to_string())?;
    // Each module starts on a known line, so that an error's line names its example.
    let mut src = String::from("#![allow(unused, clippy::all)]\n");
    let mut starts = Vec::new();
    for (n, e) in examples.iter().enumerate() {
        starts.push((src.lines().count() + 1, e.key.clone()));
        src.push_str(&format!("// {}\nmod ex_{n} {{\n{}\n}}\n", e.key, e.code));
    }
    std::fs::write(scratch.join("src/lib.rs"), src).map_err(|e| e.to_string())?;
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["check", "--offline", "--quiet", "--message-format=short"])
        .current_dir(scratch)
        .env("CARGO_TARGET_DIR", scratch.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut failed = BTreeMap::new();
    for line in stderr.lines().filter(|l| l.contains(": error")) {
        // src/lib.rs:LINE:COL: error...
        let Some(n) = line
            .strip_prefix("src/lib.rs:")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if let Some((_, key)) = starts.iter().rev().find(|(s, _)| *s <= n) {
            failed
                .entry(key.clone())
                .or_insert_with(|| line.to_string());
        }
    }
    if !out.status.success() && failed.is_empty() {
        return Err(format!(
            "cargo check failed outside the examples:\n{stderr}"
        ));
    }
    Ok(failed)
}
