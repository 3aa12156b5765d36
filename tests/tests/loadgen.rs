//! The end-to-end benchmark's frame generator: its program, run by the kernel without
//! live frames, writes exactly the frames built from scratch for each flow (addresses,
//! ports, IPv4 checksum), over a page a receiving stack has changed. Needs root.

use std::net::{Ipv4Addr, SocketAddrV4};

use berth_tests::{
    loadgen::{generated_frame, generator_output, Flows},
    packet::{decode, Packet},
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
/// A new-flow load as the benchmark makes it (fewer addresses): ports 1024-65535 of 250.
const NEW: Flows = Flows {
    ports: 64512,
    addresses: 250,
};

/// Two destinations, as plain routing sends to the backends' addresses.
fn backends() -> [SocketAddrV4; 2] {
    [
        SocketAddrV4::new(Ipv4Addr::new(10, 251, 11, 2), 5353),
        SocketAddrV4::new(Ipv4Addr::new(10, 251, 12, 2), 5353),
    ]
}

fn template(sport: u16, dst: SocketAddrV4) -> Packet {
    Packet::udp(SocketAddrV4::new(CLIENT, sport), dst)
        .macs([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .payload(&[0x42; 18])
        .no_udp_checksum()
}

fn assert_frames(template: &Packet, flows: Flows, dsts: &[SocketAddrV4], counts: &[u64]) {
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
    let gw = SocketAddrV4::new(Ipv4Addr::new(10, 251, 0, 100), 30053);
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
            ..template(1024, gw)
        })
        .find(|p| {
            let f = p.frame();
            !u16::from_be_bytes([f[24], f[25]]) > 0xffff - 100
        })
        .expect("an ID that puts the header sum near 0xffff");
    assert_frames(&t, flows, &[gw], &[0, 64512 * 150, 64512 * 249 + 3]);
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
}

#[test]
fn new_flows_to_two_destinations_keep_both_checksums_right() {
    let dsts = backends();
    let flows = NEW;
    let t = template(1024, dsts[0]);
    assert_frames(&t, flows, &dsts, &[0, 1, 64512, 64513, 200_000, 200_001]);
}
