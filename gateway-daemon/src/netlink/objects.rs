//! What the kernel's answers describe (links, addresses, devices, generic netlink
//! families), parsed from message bodies.

use super::*;

/// A link as RTM_NEWLINK describes it.
pub(super) struct Link {
    pub(super) index: u32,
    /// Its hardware type (`ARPHRD_*`).
    pub(super) arp_type: u16,
    /// Whether its other end is in another namespace (`IFLA_LINK_NETNSID`: a veth's
    /// peer there).
    pub(super) link_elsewhere: bool,
    pub(super) flags: u32,
    pub(super) name: Vec<u8>,
    pub(super) kind: Option<Vec<u8>>,
    /// Its alias (`IFLA_IFALIAS`), if it has one.
    pub(super) alias: Option<Vec<u8>>,
    /// How an XDP program is attached (`XDP_ATTACHED_*`; 0: none).
    pub(super) xdp_attached: u8,
    /// The link it is enslaved to (`IFLA_MASTER`; 0: none).
    pub(super) master: u32,
    /// A bridge's `vlan_filtering` (`IFLA_BR_VLAN_FILTERING`).
    pub(super) vlan_filtering: bool,
    /// A bridge port's STP state (`IFLA_BRPORT_STATE`, `BR_STATE_*`), if it is one.
    pub(super) port_state: Option<u8>,
}

/// The first attribute of type `ty` in `nested`, as a u8.
fn nested_u8(nested: Option<&[u8]>, ty: u16) -> Result<Option<u8>, &'static str> {
    for attr in Attrs::new(nested.unwrap_or_default()) {
        let attr = attr?;
        if attr.ty == ty {
            return Ok(attr.value.first().copied());
        }
    }
    Ok(None)
}

impl Link {
    /// Parses an ifinfomsg and its attributes.
    pub(super) fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (header, attrs) = split_fixed(body, IFINFOMSG_LEN).ok_or("short ifinfomsg")?;
        let index = ne_i32(&header[4..8]).ok_or("short ifinfomsg")?;
        let index = u32::try_from(index)
            .ok()
            .filter(|&i| i > 0)
            .ok_or("link without a valid index")?;
        let arp_type = u16::from_ne_bytes([header[2], header[3]]);
        let flags = ne_u32(&header[8..12]).ok_or("short ifinfomsg")?;
        let (mut name, mut kind, mut alias, mut xdp_attached) = (None, None, None, 0);
        let mut link_elsewhere = false;
        let (mut master, mut info_data, mut slave_kind, mut slave_data) = (0, None, None, None);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                IFLA_IFNAME => name = Some(until_nul(attr.value).to_vec()),
                IFLA_IFALIAS => alias = Some(until_nul(attr.value).to_vec()),
                IFLA_LINK_NETNSID => link_elsewhere = true,
                IFLA_MASTER => master = ne_u32(attr.value).ok_or("short IFLA_MASTER")?,
                IFLA_XDP => {
                    for xdp in Attrs::new(attr.value) {
                        let xdp = xdp?;
                        if xdp.ty == IFLA_XDP_ATTACHED {
                            xdp_attached = xdp.value.first().copied().unwrap_or(0);
                        }
                    }
                }
                IFLA_LINKINFO => {
                    for info in Attrs::new(attr.value) {
                        let info = info?;
                        match info.ty {
                            IFLA_INFO_KIND => kind = Some(until_nul(info.value).to_vec()),
                            IFLA_INFO_DATA => info_data = Some(info.value),
                            IFLA_INFO_SLAVE_KIND => slave_kind = Some(until_nul(info.value)),
                            IFLA_INFO_SLAVE_DATA => slave_data = Some(info.value),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        let vlan_filtering = kind.as_deref() == Some(b"bridge")
            && nested_u8(info_data, IFLA_BR_VLAN_FILTERING)?.is_some_and(|v| v != 0);
        let port_state = if slave_kind == Some(b"bridge") {
            nested_u8(slave_data, IFLA_BRPORT_STATE)?
        } else {
            None
        };
        Ok(Link {
            index,
            arp_type,
            link_elsewhere,
            master,
            vlan_filtering,
            port_state,
            flags,
            name: name.ok_or("link without a name")?,
            kind,
            alias,
            xdp_attached,
        })
    }

    /// What a packet sent into it needs (`ethernet_links`), if it carries Ethernet.
    pub(super) fn ether(&self) -> Option<EtherLink> {
        if self.arp_type != ARPHRD_ETHER {
            return None;
        }
        let kind = match self.kind.as_deref() {
            Some(b"veth") if self.link_elsewhere => EtherKind::PeerElsewhere,
            Some(b"bridge") if !self.vlan_filtering => EtherKind::Bridge,
            _ => EtherKind::Plain,
        };
        let port_of = (self.master != 0 && self.port_state == Some(BR_STATE_FORWARDING))
            .then_some(self.master);
        Some(EtherLink { kind, port_of })
    }

    /// Ok if this is the dummy called `name`: never touch another link.
    pub(super) fn require_dummy(&self, name: &str) -> Result<(), NetlinkError> {
        if self.name != name.as_bytes() {
            return Err(NetlinkError::AltName {
                name: name.to_owned(),
                holder: String::from_utf8_lossy(&self.name).into_owned(),
            });
        }
        let kind = self.kind.as_deref().unwrap_or_default();
        if !HOLDER_KINDS.iter().any(|k| &k[..k.len() - 1] == kind) {
            return Err(NetlinkError::NotDummy {
                name: name.to_owned(),
                kind: self
                    .kind
                    .as_deref()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
            });
        }
        Ok(())
    }
}

/// An address as RTM_NEWADDR describes it.
pub(super) struct Address {
    pub(super) index: u32,
    pub(super) local: Option<IpAddr>,
}

impl Address {
    /// Parses an ifaddrmsg and its attributes; `None` for families other than IPv4 and
    /// IPv6.
    pub(super) fn parse(body: &[u8]) -> Result<Option<Self>, &'static str> {
        let (header, attrs) = split_fixed(body, IFADDRMSG_LEN).ok_or("short ifaddrmsg")?;
        let family = i32::from(header[0]);
        if family != libc::AF_INET && family != libc::AF_INET6 {
            return Ok(None);
        }
        let index = ne_u32(&header[4..8]).ok_or("short ifaddrmsg")?;
        let (mut local, mut address) = (None, None);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            let ip = || -> Result<IpAddr, &'static str> {
                if family == libc::AF_INET {
                    <[u8; 4]>::try_from(attr.value)
                        .map(IpAddr::from)
                        .map_err(|_| "IPv4 address attribute not 4 bytes long")
                } else {
                    <[u8; 16]>::try_from(attr.value)
                        .map(IpAddr::from)
                        .map_err(|_| "IPv6 address attribute not 16 bytes long")
                }
            };
            match attr.ty {
                IFA_LOCAL => local = Some(ip()?),
                IFA_ADDRESS => address = Some(ip()?),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS differs from it only on
        // point-to-point links, where it is the peer's (IPv6 sends IFA_ADDRESS alone).
        Ok(Some(Address {
            index,
            local: local.or(address),
        }))
    }
}

/// A route as RTM_NEWROUTE describes it (the fields `host_routes` looks at).
pub(super) struct Route {
    pub(super) dst_len: u8,
    /// RTA_TABLE if present (any table), else `rtm_table`.
    pub(super) table: u32,
    pub(super) protocol: u8,
    pub(super) dst: Option<IpAddr>,
    /// The interface it sends out of (`RTA_OIF`), if one.
    pub(super) oif: Option<u32>,
}

impl Route {
    /// Parses an rtmsg and its attributes (a family other than IPv4 and IPv6 gives a
    /// route without a destination).
    pub(super) fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (header, attrs) = split_fixed(body, RTMSG_LEN).ok_or("short rtmsg")?;
        let family = i32::from(header[0]);
        let mut route = Route {
            dst_len: header[1],
            table: u32::from(header[4]),
            protocol: header[5],
            dst: None,
            oif: None,
        };
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                RTA_TABLE => {
                    route.table = ne_u32(attr.value).ok_or("RTA_TABLE not 4 bytes long")?
                }
                RTA_OIF => route.oif = Some(ne_u32(attr.value).ok_or("RTA_OIF not 4 bytes long")?),
                RTA_DST if family == libc::AF_INET => {
                    let a = <[u8; 4]>::try_from(attr.value)
                        .map_err(|_| "IPv4 RTA_DST not 4 bytes long")?;
                    route.dst = Some(IpAddr::from(a));
                }
                RTA_DST if family == libc::AF_INET6 => {
                    let a = <[u8; 16]>::try_from(attr.value)
                        .map_err(|_| "IPv6 RTA_DST not 16 bytes long")?;
                    route.dst = Some(IpAddr::from(a));
                }
                _ => {}
            }
        }
        Ok(route)
    }

    /// The address of this route if it is a host route (/32, /128) of `protocol` in
    /// `table`.
    pub(super) fn host(&self, table: u32, protocol: u8) -> Option<IpAddr> {
        let dst = self.dst?;
        let full = host_prefix_len(dst).1;
        (self.table == table && self.protocol == protocol && self.dst_len == full).then_some(dst)
    }
}

/// A device as the netdev family's dev-get describes it.
pub(super) struct Device {
    pub(super) ifindex: u32,
    pub(super) xdp_features: u64,
}

impl Device {
    /// Parses a genlmsghdr and the dev attributes.
    pub(super) fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (_, attrs) = split_fixed(body, GENL_HDRLEN).ok_or("short genlmsghdr")?;
        let (mut ifindex, mut xdp_features) = (None, 0);
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                NETDEV_A_DEV_IFINDEX => {
                    ifindex = Some(ne_u32(attr.value).ok_or("ifindex not 4 bytes long")?)
                }
                NETDEV_A_DEV_XDP_FEATURES => {
                    xdp_features = ne_u64(attr.value).ok_or("xdp-features not 8 bytes long")?
                }
                _ => {}
            }
        }
        Ok(Device {
            ifindex: ifindex.ok_or("device without an ifindex")?,
            xdp_features,
        })
    }
}

/// A generic netlink family: its message type and multicast groups.
pub(super) struct Family {
    pub(super) id: u16,
    pub(super) groups: Vec<(Vec<u8>, u32)>,
}

impl Family {
    pub(super) fn group(&self, name: &str) -> Option<u32> {
        self.groups
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|&(_, id)| id)
    }

    /// Parses the controller's answer to CTRL_CMD_GETFAMILY.
    pub(super) fn parse(body: &[u8]) -> Result<Self, &'static str> {
        let (_, attrs) = split_fixed(body, GENL_HDRLEN).ok_or("short genlmsghdr")?;
        let (mut id, mut groups) = (None, Vec::new());
        for attr in Attrs::new(attrs) {
            let attr = attr?;
            match attr.ty {
                CTRL_ATTR_FAMILY_ID => {
                    id = Some(ne_u16(attr.value).ok_or("family id not 2 bytes long")?)
                }
                CTRL_ATTR_MCAST_GROUPS => {
                    for group in Attrs::new(attr.value) {
                        let (mut name, mut gid) = (None, None);
                        for field in Attrs::new(group?.value) {
                            let field = field?;
                            match field.ty {
                                CTRL_ATTR_MCAST_GRP_NAME => {
                                    name = Some(until_nul(field.value).to_vec())
                                }
                                CTRL_ATTR_MCAST_GRP_ID => {
                                    gid = Some(ne_u32(field.value).ok_or("group id not 4 bytes")?)
                                }
                                _ => {}
                            }
                        }
                        if let (Some(name), Some(gid)) = (name, gid) {
                            groups.push((name, gid));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Family {
            id: id.ok_or("family without an id")?,
            groups,
        })
    }
}

/// Asks the generic netlink controller for family `name`.
pub(super) fn resolve_family(
    sock: &mut Socket,
    name: &'static str,
) -> Result<Family, NetlinkError> {
    const WHAT: &str = "resolving a generic netlink family";
    let request = Request::new(GENL_ID_CTRL, NLM_F_ACK)
        .fixed(&genl_header(CTRL_CMD_GETFAMILY, CTRL_VERSION))
        .attr(CTRL_ATTR_FAMILY_NAME, &c_string(name));
    let replies = match sock.request(WHAT, &request) {
        Ok(replies) => replies,
        Err(e) if e.errno() == Some(libc::ENOENT) => {
            return Err(NetlinkError::Unsupported {
                what: "the netdev generic netlink family (Linux 6.3+)",
            })
        }
        Err(e) => return Err(e),
    };
    let reply = replies
        .iter()
        .find(|r| r.ty == GENL_ID_CTRL)
        .ok_or(NetlinkError::Malformed {
            what: WHAT,
            detail: "no family in the answer",
        })?;
    Family::parse(&reply.body).map_err(|detail| NetlinkError::Malformed { what: WHAT, detail })
}
