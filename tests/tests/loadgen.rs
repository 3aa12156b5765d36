//! The end-to-end benchmark's frame generator: its program, run by the kernel without
//! live frames, writes exactly the frames built from scratch for each flow (addresses,
//! ports, IPv4 header checksum, IPv6 UDP checksum), over a page a receiving stack has
//! changed. Needs root.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use berth_tests::{
    loadgen::{generated_frame, generator_output, Flows, Template},
    packet::{decode, Packet},
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
/// Where the IPv6 new-flow load comes from (its last 16 bits high, so the addresses
/// reach the top of them).
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0xff00);
/// A new-flow load as the benchmark makes it (fewer addresses): ports 1024-65535 of 250.
const NEW: Flows = Flows {
    ports: 64512,
    addresses: 250,
};

/// Two destinations, as plain routing sends to the backends' addresses.
fn backends() -> [IpAddr; 2] {
    [
        Ipv4Addr::new(10, 251, 11, 2).into(),
        Ipv4Addr::new(10, 251, 12, 2).into(),
    ]
}

/// The IPv6 mirrors of `backends`.
fn backends6() -> [IpAddr; 2] {
    [
        "fd00:251:11::2".parse().expect("address"),
        "fd00:251:12::2".parse().expect("address"),
    ]
}

/// The benchmark's template from `src`, port `sport`, to `dst` port 5353.
fn template_from(src: IpAddr, sport: u16, dst: IpAddr) -> Template {
    Template::udp(
        SocketAddr::new(src, sport),
        SocketAddr::new(dst, 5353),
        ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
        &[0x42; 18],
    )
}

fn template(sport: u16, dst: IpAddr) -> Template {
    template_from(CLIENT.into(), sport, dst)
}

fn assert_frames(template: &Template, flows: Flows, dsts: &[IpAddr], counts: &[u64]) {
    let out = generator_output(template, flows, dsts, counts);
    for (n, got) in counts.iter().zip(&out) {
        let want = generated_frame(template, flows, dsts, *n);
        assert_eq!(
            got,
            &want,
            "frame {n} of {flows:?}:\n got  {}\n want {}",
            decode(got),
            decode(&want)
        );
    }
}

#[test]
fn a_new_flow_every_frame_varies_port_then_address_with_valid_checksums() {
    let gw = Ipv4Addr::new(10, 251, 0, 100).into();
    let flows = NEW;
    let t = template(1024, gw);
    let counts = [
        0,
        1,
        2,
        64511,
        64512,
        64513,
        64512 * 249 + 7,
        flows.tuples() - 1,
        flows.tuples(),
        3 * flows.tuples() + 12345,
    ];
    assert_frames(&t, flows, &[gw], &counts);
    // Spot checks of the expectation itself: frame 64513 is the next address's
    // second port, and the last tuple is 10.251.1.251:65535.
    let f = generated_frame(&t, flows, &[gw], 64513);
    assert_eq!(&f[26..30], &[10, 251, 1, 3]);
    assert_eq!(u16::from_be_bytes([f[34], f[35]]), 1025);
    let f = generated_frame(&t, flows, &[gw], flows.tuples() - 1);
    assert_eq!(&f[26..30], &[10, 251, 1, 251]);
    assert_eq!(u16::from_be_bytes([f[34], f[35]]), 65535);
}

#[test]
fn the_checksum_update_carries() {
    // A template whose header sum is within 100 of 0xffff (chosen by its IPv4 ID):
    // adding a later address's offset wraps the one's-complement sum.
    let gw = SocketAddrV4::new(Ipv4Addr::new(10, 251, 0, 100), 30053);
    let flows = NEW;
    let t = (0..=u16::MAX)
        .map(|id| Packet {
            id,
            ..Packet::udp(SocketAddrV4::new(CLIENT, 1024), gw)
                .macs([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
                .payload(&[0x42; 18])
                .no_udp_checksum()
        })
        .find(|p| {
            let f = p.frame();
            !u16::from_be_bytes([f[24], f[25]]) > 0xffff - 100
        })
        .map(Template::V4)
        .expect("an ID that puts the header sum near 0xffff");
    let dst = IpAddr::V4(*gw.ip());
    assert_frames(&t, flows, &[dst], &[0, 64512 * 150, 64512 * 249 + 3]);
}

#[test]
fn long_flows_cycle_ports_and_alternate_destinations() {
    let dsts = backends();
    let flows = Flows {
        ports: 16,
        addresses: 1,
    };
    let t = template(40000, dsts[0]);
    assert_frames(&t, flows, &dsts, &[0, 1, 15, 16, 17, 1_000_001]);
    let f = generated_frame(&t, flows, &dsts, 17);
    assert_eq!(&f[26..34], &[10, 251, 1, 2, 10, 251, 12, 2]);
    assert_eq!(u16::from_be_bytes([f[34], f[35]]), 40001);
    // IPv6: the destination's 16 bytes and the UDP checksum change with it.
    let dsts = backends6();
    let t = template_from(CLIENT6.into(), 40000, dsts[0]);
    assert_frames(&t, flows, &dsts, &[0, 1, 15, 16, 17, 1_000_001]);
}

#[test]
fn new_flows_to_two_destinations_keep_both_checksums_right() {
    let dsts = backends();
    let flows = NEW;
    let t = template(1024, dsts[0]);
    assert_frames(&t, flows, &dsts, &[0, 1, 64512, 64513, 200_000, 200_001]);
}

/// IPv6: the UDP checksum covers the source port and address (the pseudo-header) the
/// generator varies: it stays valid for every port and address, across the fold of
/// the one's-complement sum and where it comes out 0 (sent as 0xffff).
#[test]
fn ipv6_new_flows_keep_the_udp_checksum_valid() {
    let gw: IpAddr = "fd00:251::100".parse().expect("address");
    let flows = Flows {
        ports: 64512,
        addresses: 250,
    };
    let t = template_from(CLIENT6.into(), 1024, gw);
    let counts: Vec<u64> = [0, 1, 2, 64511, 64512, 64513, 64512 * 249 + 7]
        .into_iter()
        .chain([flows.tuples() - 1, flows.tuples() + 5])
        .chain((0..64).map(|i| i * 1_000_003 + 17))
        .collect();
    assert_frames(&t, flows, &[gw], &counts);
    let dsts = backends6();
    let t = template_from(CLIENT6.into(), 1024, dsts[0]);
    assert_frames(&t, flows, &dsts, &[0, 1, 64512, 64513, 200_000, 200_001]);
    // Frames whose checksum is 0xffff (a sum of 0xffff... folded to zero: "none"):
    // found among the tuples, then generated.
    let zero: Vec<u64> = (0..flows.tuples())
        .step_by(7)
        .filter(|&n| {
            let f = generated_frame(&t, flows, &dsts, n);
            f[60..62] == [0xff, 0xff]
        })
        .take(3)
        .collect();
    assert!(!zero.is_empty(), "no frame with checksum 0xffff found");
    assert_frames(&t, flows, &dsts, &zero);
    // Spot checks of the expectation: frame 64513 comes from the next address.
    let f = generated_frame(&t, flows, &dsts, 64513);
    assert_eq!(&f[36..38], &[0xff, 0x01]);
    assert_eq!(u16::from_be_bytes([f[54], f[55]]), 1025);
}
