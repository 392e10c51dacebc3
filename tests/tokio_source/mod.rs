//! tokio's own source, of the version Cargo.lock names, and the one rewrite that ports its code
//! to corelane: `tokio::net` becomes `corelane::net`. Shared by the parity tests.

use std::path::{Path, PathBuf};

/// tokio's source, of the version Cargo.lock names, in cargo's registry.
pub(crate) fn tokio_source() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).map_err(|e| e.to_string())?;
    let version = lock
        .split("[[package]]")
        .find_map(|p| {
            let mut lines = p.lines().map(str::trim);
            (lines.clone().any(|l| l == "name = \"tokio\""))
                .then(|| lines.find_map(|l| l.strip_prefix("version = \"")?.strip_suffix('"')))
                .flatten()
        })
        .ok_or("no tokio in Cargo.lock")?;
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = home.join("registry").join("src");
    let dirs = std::fs::read_dir(&registry).map_err(|e| format!("{}: {e}", registry.display()))?;
    dirs.filter_map(Result::ok)
        .map(|d| d.path().join(format!("tokio-{version}")))
        .find(|p| p.join("src").is_dir())
        .ok_or_else(|| format!("tokio {version} is not in {}", registry.display()))
}

/// The line with `tokio::net` replaced by `corelane::net`, in a path or in a grouped import
/// (`use tokio::{net::UdpSocket, sync::mpsc};` becomes `use corelane::net::UdpSocket; use
/// tokio::{sync::mpsc};`).
pub(crate) fn corelane_imports(l: &str) -> String {
    let l = l.replace("tokio::net", "corelane::net");
    let Some(group) = l
        .trim_start()
        .strip_prefix("use tokio::{")
        .and_then(|r| r.strip_suffix("};"))
    else {
        return l;
    };
    let (net, rest): (Vec<&str>, Vec<&str>) = group
        .split(", ")
        .map(str::trim)
        .partition(|i| i.starts_with("net::") || *i == "net");
    let mut out: Vec<String> = net.iter().map(|i| format!("use corelane::{i};")).collect();
    if !rest.is_empty() {
        out.push(format!("use tokio::{{{}}};", rest.join(", ")));
    }
    out.join(" ")
}
