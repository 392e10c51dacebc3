//! Attaching the program to an interface, and the errors a driver or the loader gives, said
//! as one line a user can act on.

use aya::programs::{ProgramError, Xdp, XdpMode};

use crate::error::Error;

pub(crate) fn attach(prog: &mut Xdp, ifname: &str, mode: XdpMode) -> Result<(), Error> {
    let name = match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "generic",
        _ => "default",
    };
    match prog.attach(ifname, mode) {
        Ok(_) => Ok(()),
        Err(ProgramError::UnknownInterface { name }) => Err(Error::NoInterface(name)),
        Err(e) => {
            let detail = chain(&e);
            let errno = crate::error::errno_of(&e);
            if errno == Some(libc::EBUSY) || errno == Some(libc::EEXIST) {
                return Err(Error::XdpBusy(ifname.to_string()));
            }
            if errno == Some(libc::EPERM) {
                return Err(Error::Privilege(format!(
                    "attaching XDP to {ifname} was refused ({detail}); it needs CAP_NET_ADMIN \
                     in the interface's network namespace"
                )));
            }
            let hint = if mode == XdpMode::Driver {
                if errno == Some(libc::EOPNOTSUPP) {
                    format!("the driver of {ifname} has no native XDP: use generic mode")
                } else {
                    format!(
                        "try generic mode, or lower the MTU of {ifname} (a driver may refuse \
                         native XDP above a page-sized frame)"
                    )
                }
            } else {
                "check `dmesg` for the verifier or driver message".to_string()
            };
            Err(Error::XdpMode {
                ifname: ifname.to_string(),
                mode: name,
                detail,
                hint,
            })
        }
    }
}

pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// What loading failed with, in one line: the verifier's log (often a hundred lines) only when
/// `CORELANE_VERIFIER_LOG` is set.
pub(crate) fn load_detail(e: &(dyn std::error::Error + 'static)) -> String {
    let full = chain(e);
    if std::env::var_os("CORELANE_VERIFIER_LOG").is_some() {
        return full;
    }
    match full.split_once('\n') {
        Some((first, _)) => format!(
            "{}; set CORELANE_VERIFIER_LOG=1 for the verifier's log",
            first.trim_end_matches(':')
        ),
        None => full,
    }
}
