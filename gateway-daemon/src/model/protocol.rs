//! The transport protocols Berth serves: what listeners, claims and the datapath
//! compare.

use std::fmt;

use gateway_common::proto;
use serde::{Deserialize, Serialize};

/// Transport protocol of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The Gateway API name (`TCP`, `UDP`): a listener's `protocol`, a claim's
    /// `spec.protocol`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }

    /// The protocol a Gateway API name names, if Berth serves it (names are
    /// case-sensitive: `tcp` is not `TCP`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            _ => None,
        }
    }

    /// IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => proto::TCP,
            Protocol::Udp => proto::UDP,
        }
    }

    /// The protocol of an IP protocol number, if Berth serves it.
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            proto::TCP => Some(Protocol::Tcp),
            proto::UDP => Some(Protocol::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
