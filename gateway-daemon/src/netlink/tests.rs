//! Parsing and name checks, without a kernel.

use super::*;

#[test]
fn attributes_are_read_with_padding_and_nesting() {
    let request = Request::new(RTM_NEWLINK, 0)
        .fixed(&ifinfomsg(7, 0, 0))
        .attr(IFLA_IFNAME, b"abc\0")
        .nested(IFLA_LINKINFO, |r| r.attr(IFLA_INFO_KIND, b"dummy\0"));
    let datagram = request.finish(1);
    let message = Messages::new(&datagram).next().unwrap().unwrap();
    let link = Link::parse(message.body).unwrap();
    assert_eq!(link.index, 7);
    assert_eq!(link.name, b"abc");
    assert_eq!(link.kind.as_deref(), Some(&b"dummy"[..]));
}

/// A bridge (`vlan_filtering` as given) and a forwarding port of it, as RTM_NEWLINK
/// describes them.
fn bridge_and_port(vlan_filtering: u8) -> (Link, Link) {
    let parse = |request: Request| {
        let datagram = request.finish(1);
        let message = Messages::new(&datagram).next().unwrap().unwrap();
        Link::parse(message.body).unwrap()
    };
    let mut ether = ifinfomsg(3, 0, 0);
    ether[2..4].copy_from_slice(&ARPHRD_ETHER.to_ne_bytes());
    let bridge = parse(
        Request::new(RTM_NEWLINK, 0)
            .fixed(&ether)
            .attr(IFLA_IFNAME, b"br0\0")
            .nested(IFLA_LINKINFO, |r| {
                r.attr(IFLA_INFO_KIND, b"bridge\0")
                    .nested(IFLA_INFO_DATA, |r| {
                        r.attr(IFLA_BR_VLAN_FILTERING, &[vlan_filtering])
                    })
            }),
    );
    ether[4..8].copy_from_slice(&4i32.to_ne_bytes());
    let port = parse(
        Request::new(RTM_NEWLINK, 0)
            .fixed(&ether)
            .attr(IFLA_IFNAME, b"p0\0")
            .attr(IFLA_MASTER, &3u32.to_ne_bytes())
            .attr(IFLA_LINK_NETNSID, &0i32.to_ne_bytes())
            .nested(IFLA_LINKINFO, |r| {
                r.attr(IFLA_INFO_KIND, b"veth\0")
                    .attr(IFLA_INFO_SLAVE_KIND, b"bridge\0")
                    .nested(IFLA_INFO_SLAVE_DATA, |r| {
                        r.attr(IFLA_BRPORT_STATE, &[BR_STATE_FORWARDING])
                    })
            }),
    );
    (bridge, port)
}

#[test]
fn a_bridge_and_its_forwarding_port_are_told_and_vlan_filtering_makes_the_bridge_plain() {
    let (bridge, port) = bridge_and_port(0);
    assert_eq!(
        bridge.ether(),
        Some(EtherLink {
            kind: EtherKind::Bridge,
            port_of: None
        })
    );
    assert_eq!(
        port.ether(),
        Some(EtherLink {
            kind: EtherKind::PeerElsewhere,
            port_of: Some(3)
        })
    );
    let (filtering, _) = bridge_and_port(1);
    assert_eq!(filtering.ether().map(|l| l.kind), Some(EtherKind::Plain));
}

#[test]
fn an_attribute_longer_than_its_buffer_is_rejected() {
    let mut buf = Vec::new();
    buf.extend_from_slice(&9u16.to_ne_bytes());
    buf.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    buf.extend_from_slice(b"ab");
    assert!(Attrs::new(&buf).next().unwrap().is_err());
}

#[test]
fn a_message_shorter_than_its_header_is_rejected() {
    let mut buf = 8u32.to_ne_bytes().to_vec();
    buf.resize(NLMSG_HDRLEN, 0);
    assert!(Messages::new(&buf).next().unwrap().is_err());
}

#[test]
fn a_capped_error_yields_errno_and_kernel_message() {
    let mut body = (-libc::EEXIST).to_ne_bytes().to_vec();
    body.extend_from_slice(&Request::new(RTM_NEWADDR, 0).finish(3)[..NLMSG_HDRLEN]);
    let tlv = Request::new(0, 0).attr(NLMSGERR_ATTR_MSG, b"exists\0");
    body.extend_from_slice(&tlv.buf[NLMSG_HDRLEN..]);
    let message = Message {
        ty: NLMSG_ERROR,
        flags: NLM_F_CAPPED | NLM_F_ACK_TLVS,
        seq: 3,
        body: &body,
    };
    let status = Status::parse(&message).unwrap();
    assert_eq!(status.errno, -libc::EEXIST);
    assert_eq!(status.message.as_deref(), Some("exists"));
}

#[test]
fn interface_names_follow_the_kernel_rules() {
    for good in ["berth0", "a", "x-y_z.1", "fifteen_chars_x"] {
        assert!(check_name(good).is_ok(), "{good}");
    }
    for bad in ["", ".", "..", "a/b", "a:b", "a b", "sixteen_chars_xx"] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
}

/// The message a route request becomes on the wire.
struct Sent {
    ty: u16,
    flags: u16,
    rtmsg: Vec<u8>,
    attrs: Vec<(u16, Vec<u8>)>,
}

fn sent(request: &Request) -> Sent {
    let datagram = request.finish(1);
    let message = Messages::new(&datagram).next().unwrap().unwrap();
    let (fixed, attrs) = split_fixed(message.body, RTMSG_LEN).unwrap();
    let attrs = Attrs::new(attrs)
        .map(|a| a.map(|a| (a.ty, a.value.to_vec())).unwrap())
        .collect();
    Sent {
        ty: message.ty,
        flags: message.flags,
        rtmsg: fixed.to_vec(),
        attrs,
    }
}

const OURS: HostRoute = HostRoute {
    table: 100,
    protocol: RTPROT_BERTH,
    addr: IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
};

#[test]
fn a_host_route_is_added_exclusively_in_its_table_with_its_protocol_scope_link_and_device() {
    let Sent {
        ty,
        flags,
        rtmsg,
        attrs,
    } = sent(&add_route_request(OURS, 7));
    assert_eq!(ty, RTM_NEWROUTE);
    assert_eq!(
        flags,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        "never NLM_F_REPLACE: a route of another protocol stays"
    );
    // family, dst_len, src_len, tos, table, protocol, scope, type, flags (4 bytes)
    assert_eq!(rtmsg, [2, 32, 0, 0, 100, 251, 253, 1, 0, 0, 0, 0]);
    assert_eq!(
        attrs,
        vec![
            (RTA_TABLE, 100u32.to_ne_bytes().to_vec()),
            (RTA_DST, vec![10, 0, 0, 1]),
            (RTA_OIF, 7u32.to_ne_bytes().to_vec()),
        ]
    );
}

#[test]
fn an_ipv6_host_route_is_a_128_bit_prefix_and_a_table_above_255_travels_in_rta_table() {
    let addr: IpAddr = "2001:db8::1".parse().unwrap();
    let route = HostRoute {
        table: 1000,
        addr,
        ..OURS
    };
    let Sent { rtmsg, attrs, .. } = sent(&add_route_request(route, 1));
    assert_eq!(rtmsg[..8], [10, 128, 0, 0, RT_TABLE_COMPAT, 251, 253, 1]);
    assert_eq!(attrs[0], (RTA_TABLE, 1000u32.to_ne_bytes().to_vec()));
    assert_eq!(attrs[1], (RTA_DST, octets(&addr)));
}

#[test]
fn a_host_route_is_removed_by_table_address_and_protocol_in_any_scope() {
    let Sent {
        ty,
        flags,
        rtmsg,
        attrs,
    } = sent(&remove_route_request(OURS));
    assert_eq!((ty, flags), (RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK));
    assert_eq!(
        rtmsg,
        [2, 32, 0, 0, 100, 251, RT_SCOPE_NOWHERE, 0, 0, 0, 0, 0],
        "the kernel matches the protocol, so another protocol's route is never removed"
    );
    assert_eq!(
        attrs,
        vec![
            (RTA_TABLE, 100u32.to_ne_bytes().to_vec()),
            (RTA_DST, vec![10, 0, 0, 1]),
        ],
        "no device: a route an earlier run put on another device is removed too"
    );
}

#[test]
fn only_host_routes_of_the_protocol_in_the_table_are_read_as_announced() {
    // A route as the kernel describes it in a dump.
    let described = |table: u32, protocol: u8, dst: &[u8], dst_len: u8| {
        let family = if dst.len() == 4 {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let request = Request::new(RTM_NEWROUTE, 0)
            .fixed(&rtmsg(
                family,
                dst_len,
                table,
                protocol,
                RT_SCOPE_LINK,
                RTN_UNICAST,
            ))
            .attr(RTA_TABLE, &table.to_ne_bytes())
            .attr(RTA_DST, dst)
            .attr(RTA_OIF, &3u32.to_ne_bytes());
        let datagram = request.finish(1);
        let message = Messages::new(&datagram).next().unwrap().unwrap();
        Route::parse(message.body).unwrap().host(100, RTPROT_BERTH)
    };
    let v4 = [10, 0, 0, 1];
    assert_eq!(described(100, 251, &v4, 32), Some(OURS.addr));
    let v6: IpAddr = "2001:db8::1".parse().unwrap();
    assert_eq!(described(100, 251, &octets(&v6), 128), Some(v6));
    assert_eq!(
        described(100, 4, &v4, 32),
        None,
        "another protocol (static)"
    );
    assert_eq!(described(101, 251, &v4, 32), None, "another table");
    assert_eq!(
        described(100, 251, &[10, 0, 0, 0], 24),
        None,
        "not a host route"
    );
    assert!(Route::parse(&[2, 32, 0]).is_err(), "a short rtmsg");
}

#[test]
fn a_dump_of_one_table_asks_the_kernel_to_filter_by_table_and_protocol() {
    let Sent {
        ty,
        flags,
        rtmsg,
        attrs,
    } = sent(&route_dump_request(libc::AF_INET, 300, RTPROT_BERTH));
    assert_eq!((ty, flags), (RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP));
    // A strict dump request has zero prefix lengths, tos and scope (else EINVAL).
    assert_eq!(rtmsg[..8], [2, 0, 0, 0, RT_TABLE_COMPAT, 251, 0, 0]);
    assert_eq!(attrs, vec![(RTA_TABLE, 300u32.to_ne_bytes().to_vec())]);
}

#[test]
fn the_route_to_a_local_address_leaves_out_of_loopback() {
    // RTM_GETROUTE needs no privilege and sends nothing.
    let lo = crate::sys::iface::name_to_index("lo").expect("lo");
    assert_eq!(route_oif("127.0.0.1".parse().unwrap()).unwrap(), Some(lo));
}
