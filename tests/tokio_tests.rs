//! The parity gate: tokio's own integration tests for sockets (read from tokio's source, the
//! version Cargo.lock names) run on corelane's sockets in a lab, with only mechanical
//! rewrites: `tokio::net` becomes `corelane::net` and `#[tokio::test(...)]` becomes
//! `#[corelane::test]`. Nothing else changes: `tokio::spawn` stays, and so do tokio-test's
//! `task::spawn`, `assert_pending!` and the rest.
//!
//! Every test passes except those in `LEFT_OUT`, each with its reason; a listed one that
//! starts passing fails the gate too (take it out of the list), and so does a test tokio
//! removed. Needs no root: the lab is corelane's runtime over an in-memory queue. The tests
//! are built as a crate of their own under the test's scratch directory (`cargo build
//! --offline`, about a minute the first time) and each file's binary is run with a time limit.
//!
//! Run: `cargo test --release --test tokio_tests`.

mod tokio_source;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio_source::{corelane_imports, tokio_source};

/// tokio's socket test files (its `tests/`): TCP, UDP, and the I/O helpers over TCP. Unix
/// sockets (`uds_*`) are the kernel's own: corelane has none.
const FILES: &[&str] = &[
    "buffered.rs",
    "io_copy_bidirectional.rs",
    "net_bind_resource.rs",
    "net_panic.rs",
    "net_quickack.rs",
    "tcp_accept.rs",
    "tcp_accept_ready.rs",
    "tcp_connect.rs",
    "tcp_echo.rs",
    "tcp_into_split.rs",
    "tcp_into_std.rs",
    "tcp_peek.rs",
    "tcp_shutdown.rs",
    "tcp_socket.rs",
    "tcp_split.rs",
    "tcp_stream.rs",
    "udp.rs",
];

/// What does not pass, by file (the whole file) or `file: test`, and why.
const LEFT_OUT: &[(&str, &str)] = &[
    ("buffered.rs", KERNEL_PEER),
    ("net_bind_resource.rs", FROM_KERNEL),
    ("net_panic.rs", FROM_KERNEL),
    (
        "tcp_accept_ready.rs",
        "builds its sockets with socket2 and a Unix listener, and reads tokio's internal \
         `async_io`",
    ),
    ("tcp_into_std.rs", FROM_KERNEL),
    ("tcp_peek.rs", FROM_KERNEL),
    ("tcp_split.rs", KERNEL_PEER),
    ("tcp_into_split.rs: drop_write", KERNEL_PEER),
    ("tcp_into_split.rs: reunite", KERNEL_PEER),
    (
        "tcp_socket.rs: nodelay",
        "corelane's TCP starts with Nagle's algorithm off (nodelay true; set_nodelay(false) \
         turns it on), where the kernel's starts with it on",
    ),
    (
        "udp.rs: broadcast",
        "corelane sends no UDP broadcast: set_broadcast(true) is refused (Unsupported)",
    ),
    ("udp.rs: multicast_loop_v4", MULTICAST),
    ("udp.rs: multicast_loop_v6", MULTICAST),
    ("udp.rs: multicast_ttl_v4", MULTICAST),
];

const FROM_KERNEL: &str = "turns a kernel socket (std::net) into a tokio one or back: a kernel \
                           socket cannot become a corelane one, nor the reverse";
const KERNEL_PEER: &str = "its peer is a kernel socket (std::net) on loopback: in a lab the \
                           loopback is corelane's own, so the two never meet (against a real \
                           interface they do: tests/tokio_port.rs)";
const MULTICAST: &str = "corelane neither sends to nor joins multicast groups: the setters are \
                         refused (Unsupported)";

/// How long one file's tests may take; a left-out file that hangs is stopped sooner.
const FILE_LIMIT: Duration = Duration::from_secs(180);
const LEFT_OUT_LIMIT: Duration = Duration::from_secs(15);

/// What came of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
}

#[test]
fn tokios_own_socket_tests_pass_on_corelane() -> Result<(), String> {
    let tokio = tokio_source()?.join("tests");
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tokio-tests");
    let mut counts = BTreeMap::new();
    std::fs::create_dir_all(scratch.join("tests")).map_err(|e| e.to_string())?;
    for f in FILES {
        let text = std::fs::read_to_string(tokio.join(f))
            .map_err(|e| format!("{}: {e}", tokio.join(f).display()))?;
        let ported = port(&text);
        assert!(
            !ported.contains("tokio::net::") && !ported.contains("#[tokio::test"),
            "{f}: the rewrite left tokio's sockets or test attribute"
        );
        counts.insert(*f, ported.matches("#[corelane::test]").count());
        std::fs::write(scratch.join("tests").join(f), ported).map_err(|e| e.to_string())?;
    }
    assert!(
        counts.values().sum::<usize>() >= 60,
        "only {counts:?} tests found in {}",
        tokio.display()
    );
    let (binaries, errors) = build(&scratch)?;
    let mut wrong = Vec::new();
    let mut passed = 0;
    for f in FILES {
        let whole = left_out(f);
        let Some(bin) = binaries.get(*f) else {
            if whole.is_none() {
                wrong.push(format!(
                    "{f} does not compile against corelane:\n{}",
                    errors.get(*f).map_or("", String::as_str)
                ));
            }
            continue;
        };
        let limit = if whole.is_some() {
            LEFT_OUT_LIMIT
        } else {
            FILE_LIMIT
        };
        let (results, finished) = run(bin, limit)?;
        if let Some(why) = whole {
            if finished && results.values().all(|o| *o == Outcome::Passed) {
                wrong.push(format!(
                    "{f} now passes on corelane: take it out of LEFT_OUT (it said: {why})"
                ));
            }
            continue;
        }
        if !finished {
            wrong.push(format!(
                "{f}: its tests did not finish within {FILE_LIMIT:?}; these had: {results:?}"
            ));
        }
        for (name, outcome) in &results {
            let key = format!("{f}: {name}");
            match (outcome, left_out(&key)) {
                (Outcome::Passed, None) => passed += 1,
                (Outcome::Failed, Some(_)) => {}
                (Outcome::Failed, None) => wrong.push(format!(
                    "{key} fails on corelane (fix corelane, or list it in LEFT_OUT with the \
                     reason)"
                )),
                (Outcome::Passed, Some(why)) => wrong.push(format!(
                    "{key} now passes on corelane: take it out of LEFT_OUT (it said: {why})"
                )),
            }
        }
        // A listed test tokio no longer has.
        let names: BTreeSet<&String> = results.keys().collect();
        for (key, _) in LEFT_OUT {
            if let Some(name) = key.strip_prefix(&format!("{f}: "))
                && finished
                && !names.contains(&name.to_string())
            {
                wrong.push(format!("{key} is no longer among tokio's tests: unlist it"));
            }
        }
    }
    // In CI its build (some 850 MB) goes once read, as the suite's other phases' do.
    if std::env::var("CI").as_deref() == Ok("true") {
        let _ = std::fs::remove_dir_all(scratch.join("target"));
    }
    assert!(
        wrong.is_empty(),
        "the parity gate ({passed} of tokio's tests passed):\n{}",
        wrong.join("\n")
    );
    // What a regression would take away: most of tokio's socket tests run here.
    assert!(passed >= 60, "only {passed} of tokio's tests passed");
    eprintln!(
        "{passed} of tokio's socket tests pass on corelane; {} left out",
        LEFT_OUT.len()
    );
    Ok(())
}

/// The reason `key` (a file or `file: test`) is left out, if it is.
fn left_out(key: &str) -> Option<&'static str> {
    LEFT_OUT
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, why)| *why)
}

/// tokio's test file on corelane's sockets: the imports and the test attribute, nothing else.
fn port(text: &str) -> String {
    let mut out = String::new();
    for l in text.lines() {
        let l = corelane_imports(l);
        let t = l.trim_start();
        let l = if t.starts_with("#[tokio::test") && t.ends_with(']') {
            format!("{}#[corelane::test]", &l[..l.len() - t.len()])
        } else {
            l
        };
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// Builds the ported files as the tests of one crate under `scratch`, keeping on past a
/// file that does not compile. Returns each file's test binary and each failed file's first
/// errors.
#[allow(clippy::type_complexity)]
fn build(scratch: &Path) -> Result<(BTreeMap<String, PathBuf>, BTreeMap<String, String>), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // tokio's files say which of tokio's features they need: the crate has them all, on.
    let features = [
        "full",
        "net",
        "macros",
        "rt",
        "rt-multi-thread",
        "io-util",
        "time",
        "sync",
    ];
    let manifest = format!(
        "[package]\nname = \"tokio-tests\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[features]\ndefault = [{}]\n{}\n[dependencies]\n\
         corelane = {{ path = {:?} }}\nbytes = \"1\"\nfutures = \"0.3\"\n\
         tokio-stream = \"0.1\"\ntokio-test = \"0.4\"\n\
         tokio = {{ version = \"1\", features = [\"rt\", \"rt-multi-thread\", \"macros\", \
         \"io-util\", \"net\", \"time\", \"sync\"] }}\n\n[workspace]\n",
        features.map(|f| format!("{f:?}")).join(", "),
        features.map(|f| format!("{f:?} = []\n")).concat(),
        root.display().to_string()
    );
    std::fs::write(scratch.join("Cargo.toml"), manifest).map_err(|e| e.to_string())?;
    std::fs::copy(root.join("Cargo.lock"), scratch.join("Cargo.lock"))
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(scratch.join("src")).map_err(|e| e.to_string())?;
    std::fs::write(scratch.join("src/lib.rs"), "").map_err(|e| e.to_string())?;
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args([
            "build",
            "--tests",
            "--offline",
            "--keep-going",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(scratch)
        .env("CARGO_TARGET_DIR", scratch.join("target"))
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env_remove("RUSTFLAGS")
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut binaries = BTreeMap::new();
    for line in stdout.lines() {
        // {"reason":"compiler-artifact",...,"target":{...,"src_path":".../tests/F.rs",...},
        //  ...,"executable":"/path/to/F-hash",...}
        if !line.contains("\"reason\":\"compiler-artifact\"") {
            continue;
        }
        let (Some(src), Some(exe)) = (field(line, "src_path"), field(line, "executable")) else {
            continue;
        };
        if let Some(file) = Path::new(&src).file_name().and_then(|n| n.to_str())
            && FILES.contains(&file)
        {
            binaries.insert(file.to_string(), PathBuf::from(exe));
        }
    }
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    for line in stderr.lines() {
        // "  --> tests/F.rs:LINE:COL" follows each error's first line.
        for f in FILES {
            if line.contains(&format!("tests/{f}:")) {
                let e = errors.entry(f.to_string()).or_default();
                if e.lines().count() < 40 {
                    e.push_str(line);
                    e.push('\n');
                }
            }
        }
    }
    if binaries.is_empty() {
        return Err(format!(
            "cargo build of tokio's tests made nothing:\n{stderr}"
        ));
    }
    Ok((binaries, errors))
}

/// The text of string field `name` in one line of cargo's JSON (its values here hold no
/// quotes or escapes: paths).
fn field(line: &str, name: &str) -> Option<String> {
    let at = line.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = line[at..].find('"')?;
    Some(line[at..at + len].to_string())
}

/// Runs one test binary for at most `limit`: each test's outcome, and whether it finished.
fn run(bin: &Path, limit: Duration) -> Result<(BTreeMap<String, Outcome>, bool), String> {
    let mut child = Command::new(bin)
        .args(["--test-threads=2"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    // Read while it runs, so a full pipe never stops it.
    let mut pipe = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let finished = loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break true;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = reader.join().map_err(|_| "the reader panicked")?;
    let mut results = BTreeMap::new();
    for line in stdout.lines() {
        // "test NAME ... ok" / "... FAILED" / "... ignored"
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, outcome)) = rest.rsplit_once(" ... ") else {
            continue;
        };
        let outcome = match outcome {
            "ok" => Outcome::Passed,
            "FAILED" => Outcome::Failed,
            _ => continue,
        };
        results.insert(name.to_string(), outcome);
    }
    Ok((results, finished))
}
