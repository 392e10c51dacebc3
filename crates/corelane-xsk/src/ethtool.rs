//! ethtool over ioctl: an interface's queues (channels) and its driver.

use crate::error::Error;
use crate::sys::{
    ETHTOOL_GCHANNELS, ETHTOOL_GDRVINFO, ETHTOOL_SCHANNELS, EthtoolChannels, EthtoolDrvinfo,
    ethtool,
};

/// An interface's queues (ethtool channels): what it has and the most it can have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channels {
    /// RX-only channels now.
    pub rx: u32,
    /// TX-only channels now.
    pub tx: u32,
    /// Combined (RX and TX) channels now.
    pub combined: u32,
    /// Most RX-only channels.
    pub max_rx: u32,
    /// Most TX-only channels.
    pub max_tx: u32,
    /// Most combined channels.
    pub max_combined: u32,
}

impl Channels {
    /// Receive queues now (rx + combined, at least 1).
    pub fn rx_queues(&self) -> u32 {
        (self.rx + self.combined).max(1)
    }

    /// The most receive queues the driver allows.
    pub fn max_rx_queues(&self) -> u32 {
        (self.max_rx + self.max_combined).max(1)
    }
}

fn is_unsupported(e: &Error) -> bool {
    matches!(e, Error::Io(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP))
}

/// The interface's channels (ethtool -l); None when the driver does not report them (one queue).
pub fn channels(ifname: &str) -> Result<Option<Channels>, Error> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    match ethtool(ifname, &mut ch) {
        Ok(()) => Ok(Some(Channels {
            rx: ch.rx_count,
            tx: ch.tx_count,
            combined: ch.combined_count,
            max_rx: ch.max_rx,
            max_tx: ch.max_tx,
            max_combined: ch.max_combined,
        })),
        Err(e) if is_unsupported(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The interface's RX queue count (ethtool channels: rx + combined; 1 when the driver does not
/// report channels).
pub fn rx_queue_count(ifname: &str) -> Result<u32, Error> {
    Ok(channels(ifname)?.map_or(1, |c| c.rx_queues()))
}

/// Sets the interface's channels (ethtool -L). Setting more queues than the driver's maximum,
/// or on a driver without channel control, is a [`Error::Config`] that says so.
pub fn set_channels(ifname: &str, want: Channels) -> Result<(), Error> {
    let now = channels(ifname)?.ok_or_else(|| {
        Error::Config(format!(
            "{ifname}: the driver does not report or set its queues (ethtool -l {ifname})"
        ))
    })?;
    if want.rx > now.max_rx || want.tx > now.max_tx || want.combined > now.max_combined {
        return Err(Error::Config(format!(
            "{ifname} allows at most {} rx, {} tx and {} combined queue(s); asked for {}, {} and {}",
            now.max_rx, now.max_tx, now.max_combined, want.rx, want.tx, want.combined
        )));
    }
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_SCHANNELS,
        rx_count: want.rx,
        tx_count: want.tx,
        combined_count: want.combined,
        ..EthtoolChannels::default()
    };
    ethtool(ifname, &mut ch)
}

/// An interface's driver and bus (ethtool -i).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver name (`veth`, `ice`, `mlx5_core`, ...).
    pub driver: String,
    /// Bus address (`0000:3b:00.0` for a PCI device; empty for a virtual one).
    pub bus_info: String,
}

/// The interface's driver name and bus address.
pub fn driver_info(ifname: &str) -> Result<DriverInfo, Error> {
    let mut info = EthtoolDrvinfo::new(ETHTOOL_GDRVINFO);
    match ethtool(ifname, &mut info) {
        Ok(()) => {}
        Err(e) if is_unsupported(&e) => return Ok(DriverInfo::default()),
        Err(e) => return Err(e),
    }
    let text = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    Ok(DriverInfo {
        driver: text(&info.driver),
        bus_info: text(&info.bus_info),
    })
}

/// Sets an interface's receive queues to `need` (more or fewer), through combined channels
/// or separate receive channels as the driver has them, and returns what they were.
pub fn set_rx_queues(ifname: &str, old: Channels, need: u32) -> Result<Channels, Error> {
    let want = if old.max_combined > 0 && old.max_rx == 0 {
        Channels {
            combined: need,
            ..old
        }
    } else {
        Channels {
            rx: need.saturating_sub(old.combined),
            tx: old
                .tx
                .max(need.saturating_sub(old.combined))
                .min(old.max_tx),
            ..old
        }
    };
    set_channels(ifname, want)?;
    tracing::info!("{ifname}: receive queues set to {need} for this run");
    Ok(old)
}
