//! The hand-off from XDP to TC, one program at a time (`BPF_PROG_TEST_RUN` in the
//! fixture namespace): XDP translates a forward packet for an egress that takes no XDP
//! frames and passes it up with the egress's MACs and a shim naming the egress; the TC
//! hand-off program (`berth_tc_in`) removes the shim, decrements the TTL and redirects
//! the packet exactly as routing would have sent it. A frame forging the shim is dropped
//! (by XDP, which sees every frame first, and by TC without the datapath's secret),
//! and without the TC program on the receiving interface XDP hands nothing off.
//! Needs root.

use berth::datapath::{DesiredState, Egress, Protocol, ServiceAddr, WeightedBackend};
use berth_tests::{
    packet::Packet,
    xdp::{net::*, run_gateway, run_tc_in, FixtureNet, TestDatapath, TC_REDIRECT, TC_SHOT},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
/// The shim's length: what XDP adds to the frame.
const SHIM: usize = 16;

/// A datapath serving UDP GW:53 from B1 (behind fx1), with fx1 taking no XDP frames and
/// (if `handoff`) the TC hand-off program attached to fx0.
fn datapath(fx: &FixtureNet, handoff: bool) -> TestDatapath {
    let mut t = TestDatapath::load();
    let service = ServiceAddr {
        addr: GW.into(),
        protocol: Protocol::Udp,
        port: 53,
    };
    let backend = WeightedBackend {
        endpoint: sa(B1, 53).into(),
        weight: 1,
    };
    t.dp.apply(&DesiredState::default().with_service(service, vec![backend]))
        .unwrap_or_else(|e| panic!("apply: {}", berth::error_chain(&e)));
    let handoff_in: &[u32] = if handoff { &[fx.fx0] } else { &[] };
    t.set_xmit(&[(fx.fx1, Egress::Tc)], handoff_in);
    t
}

/// The client's datagram to the service, as it arrives on fx0.
fn request() -> Packet {
    Packet::udp(sa(CLIENT, 40000), sa(GW, 53)).macs(CLIENT_MAC, FX0_MAC)
}

/// What the gateway sends out of fx1: translated, MACs of the hop, TTL one less.
fn forwarded() -> Packet {
    let mut p = request().with_dst(sa(B1, 53)).macs(FX1_MAC, mac_of(B1));
    p.ttl -= 1;
    p
}

fn counter(t: &TestDatapath, name: &str) -> u64 {
    t.dp.counters().expect("counters")[name]
}

#[test]
fn xdp_hands_a_forward_packet_to_tc_which_sends_it_as_routing_would() {
    let fx = FixtureNet::new();
    let mut t = datapath(&fx, true);
    let input = request().frame();
    let (verdict, passed) = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, &input));
    assert_eq!(verdict, XDP_PASS, "handed up to TC");
    assert_eq!(
        passed.len(),
        input.len() + SHIM,
        "with the shim: {passed:02x?}"
    );
    let want = forwarded().frame();
    assert_eq!(
        &passed[..14],
        &want[..14],
        "the hop's MACs are written by XDP"
    );
    assert_eq!(passed[14], 0, "the shim is no IP packet (version 0)");

    let (verdict, sent) = run_tc_in(&mut t.dp, &passed);
    assert_eq!(verdict, TC_REDIRECT, "TC redirects it: {sent:02x?}");
    assert_eq!(
        sent,
        want,
        "TC sends what routing would: shim gone, TTL decremented\n got  {sent:02x?}\n want {want:02x?}"
    );
    assert_eq!(counter(&t, "tc_redirect"), 1);
    assert_eq!(counter(&t, "kernel_forward_no_xdp_egress"), 0);
}

#[test]
fn a_frame_forging_the_shim_is_dropped_not_redirected() {
    let fx = FixtureNet::new();
    let mut t = datapath(&fx, true);
    let input = request().frame();
    let (_, mut passed) = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, &input));
    assert_eq!(passed.len(), input.len() + SHIM);
    // A sender on the wire knows the layout but not the datapath's secret.
    for b in &mut passed[14 + 8..14 + 12] {
        *b ^= 0x5a;
    }
    let (verdict, _) = run_tc_in(&mut t.dp, &passed);
    assert_eq!(verdict, TC_SHOT);
    assert_eq!(counter(&t, "tc_handoff_forged"), 1);
    assert_eq!(counter(&t, "tc_redirect"), 0);
    // XDP sees such a frame first, whatever its secret: it never reaches TC.
    let mut genuine = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, &input)).1;
    let mut ipv6 = genuine.clone();
    ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    for frame in [&mut genuine, &mut ipv6] {
        let (verdict, _) = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, frame));
        assert_eq!(
            verdict, XDP_DROP,
            "a shim arriving from the wire: {frame:02x?}"
        );
    }
    assert_eq!(counter(&t, "tc_handoff_forged"), 3);

    // An ordinary packet is none of the program's business.
    let (verdict, _) = run_tc_in(&mut t.dp, &forwarded().frame());
    assert_eq!(verdict, berth_tests::xdp::TC_NEXT);
}

#[test]
fn without_the_tc_program_on_the_receiving_interface_the_kernel_forwards() {
    let fx = FixtureNet::new();
    let mut t = datapath(&fx, false);
    let input = request().frame();
    let (verdict, passed) = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, &input));
    assert_eq!(verdict, XDP_PASS);
    let mut want = forwarded();
    // The kernel's path: translated only; the kernel routes it (TTL, MACs).
    want.ttl += 1;
    let want = want.macs(CLIENT_MAC, FX0_MAC).frame();
    assert_eq!(passed, want, "no shim, as the kernel's path wants it");
    assert_eq!(counter(&t, "kernel_forward_no_xdp_egress"), 1);
}
