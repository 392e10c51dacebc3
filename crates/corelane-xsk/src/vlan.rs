//! The VLAN a runtime serves on its interface: which tagged frames are its own.

use std::fmt;

/// The largest VLAN id (0 and 4095 are reserved).
pub const MAX_VLAN: u16 = 4094;

/// The VLAN tags of the frames a runtime serves on its interface: an 802.1Q VLAN, optionally
/// inside an 802.1ad service VLAN (QinQ: the outer tag, TPID 0x88a8, carries the service
/// VLAN, the inner one, 0x8100, the VLAN). `Vlan::default()`: untagged frames.
///
/// ```
/// use corelane_xsk::Vlan;
/// assert_eq!(Vlan::tagged(100).to_string(), "VLAN 100");
/// assert_eq!(Vlan::qinq(200, 100).to_string(), "VLAN 100 in service VLAN 200");
/// assert_eq!(Vlan::qinq(200, 100).tag_bytes(), 8);
/// assert!(Vlan::tagged(4095).check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Vlan {
    /// The 802.1Q VLAN (0: no 802.1Q tag).
    pub id: u16,
    /// The 802.1ad service VLAN outside it (0: none).
    pub service: u16,
}

impl Vlan {
    /// 802.1Q VLAN `id` (0: untagged frames).
    pub fn tagged(id: u16) -> Vlan {
        Vlan { id, service: 0 }
    }

    /// 802.1Q VLAN `id` inside 802.1ad service VLAN `service` (QinQ).
    pub fn qinq(service: u16, id: u16) -> Vlan {
        Vlan { id, service }
    }

    /// Untagged frames: no VLAN at all.
    pub fn is_untagged(&self) -> bool {
        self.id == 0 && self.service == 0
    }

    /// The bytes the tags add to every frame: 0, 4 or 8.
    pub fn tag_bytes(&self) -> usize {
        4 * (usize::from(self.id != 0) + usize::from(self.service != 0))
    }

    /// The bytes the tags take out of the interface's MTU: a link carries a frame one tag
    /// (4 bytes) over its MTU, so only a second tag (QinQ) comes out of the packet.
    pub fn mtu_cost(&self) -> usize {
        self.tag_bytes().saturating_sub(4)
    }

    /// Refuses an id outside 1 to [`MAX_VLAN`] (0 stands for no tag), in one line.
    pub fn check(&self) -> Result<(), String> {
        for (what, v) in [("VLAN", self.id), ("service VLAN", self.service)] {
            if v > MAX_VLAN {
                return Err(format!("{what} {v} is not a VLAN id (1 to {MAX_VLAN})"));
            }
        }
        Ok(())
    }

    /// As the grant broker says it: `ID`, or `ID SERVICE` with a service VLAN.
    pub fn to_wire(&self) -> String {
        if self.service == 0 {
            self.id.to_string()
        } else {
            format!("{} {}", self.id, self.service)
        }
    }

    /// Reads [`Vlan::to_wire`]'s text (None when it is not that).
    pub fn from_wire(text: &str) -> Option<Vlan> {
        let mut f = text.split_whitespace();
        let id = f.next()?.parse().ok()?;
        let service = match f.next() {
            Some(s) => s.parse().ok()?,
            None => 0,
        };
        f.next().is_none().then_some(Vlan { id, service })
    }
}

impl fmt::Display for Vlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.id, self.service) {
            (0, 0) => f.write_str("untagged frames"),
            (id, 0) => write!(f, "VLAN {id}"),
            (0, s) => write!(f, "service VLAN {s}"),
            (id, s) => write!(f, "VLAN {id} in service VLAN {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_reads_back_and_rejects_anything_else() {
        for v in [
            Vlan::default(),
            Vlan::tagged(7),
            Vlan::qinq(200, 100),
            Vlan::qinq(5, 0),
        ] {
            assert_eq!(Vlan::from_wire(&v.to_wire()), Some(v), "{v}");
        }
        assert_eq!(Vlan::from_wire("100"), Some(Vlan::tagged(100)));
        for bad in ["", "x", "100 x", "100 200 300", "-1", "70000"] {
            assert_eq!(Vlan::from_wire(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ids_out_of_range_are_named() {
        assert!(Vlan::qinq(MAX_VLAN, MAX_VLAN).check().is_ok());
        let e = Vlan::qinq(4095, 1).check().unwrap_err();
        assert_eq!(e, "service VLAN 4095 is not a VLAN id (1 to 4094)");
        assert_eq!(Vlan::qinq(0, 0).tag_bytes(), 0);
        assert_eq!(Vlan::tagged(3).tag_bytes(), 4);
        let costs = [
            Vlan::default(),
            Vlan::tagged(3),
            Vlan::qinq(5, 0),
            Vlan::qinq(5, 3),
        ]
        .map(|v| v.mtu_cost());
        assert_eq!(costs, [0, 0, 0, 4]);
    }
}
