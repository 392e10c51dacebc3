//! Capabilities: may this process load XDP programs and open AF_XDP sockets?

use crate::error::Error;

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Checks that this process may load XDP programs and open AF_XDP sockets.
pub fn check_privileges() -> Result<(), Error> {
    let eff = effective_caps();
    let has = |c: u32| eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_NET_RAW) {
        missing.push("CAP_NET_RAW");
    }
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Privilege(format!(
            "this process lacks {}",
            missing.join(", ")
        )))
    }
}

fn effective_caps() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}
