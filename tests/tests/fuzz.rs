//! Packet fuzzing through `BPF_PROG_TEST_RUN`: 10^4 random and mutated packets of both
//! IP families with router and SNAT services configured, every output checked against
//! the invariants of `berth_tests::fuzz` (unchanged XDP_PASS for what is not ours, valid
//! checksums and a configured backend for what is translated, a SNAT flow's node address
//! and claimed port both ways, only expected verdicts). A fixed seed,
//! and also `BERTH_FUZZ_SEED` when set. `cargo xtask fuzz datapath` runs 10^6. Needs root.

use berth_tests::fuzz;

const PACKETS: u64 = 10_000;
const SEED: u64 = 0x5eed_b347;

fn fuzz_one(seed: u64) {
    let report = fuzz::run(PACKETS, seed);
    eprintln!("{report}");
    assert_eq!(
        report.violations, 0,
        "packets broke the datapath's invariants:\n{report}"
    );
    assert_eq!(report.packets, PACKETS);
    // The generator reaches the deep paths: without these the run proves little.
    for (counter, at_least) in [
        ("new_flow", 100),
        ("redirect", 100),
        ("tx", 10),
        ("icmp_translated", 10),
        ("fragment_translated", 10),
        ("drop_malformed", 10),
        ("drop_fragment", 1),
        ("drop_no_backend", 1),
        ("tc_icmp6_redirect_dropped", 1),
        ("backend_gone", 1),
        ("tc_reply_translated", 10),
        ("kernel_forward_ttl", 1),
        ("kernel_forward_no_neighbour", 1),
        ("kernel_forward_no_xdp_egress", 1),
        ("snat_new_flow", 100),
        ("snat_port_retry", 10),
        ("drop_snat_ports_exhausted", 10),
        ("drop_snat_no_source", 10),
        ("tc_masq_translated", 10),
        // Replies now and then on the other interface, ICMP errors from routers.
        ("reply_spoofed", 10),
        ("drop_tcp_flags", 10),
    ] {
        assert!(
            report.counters[counter] >= at_least,
            "counter {counter} below {at_least}:\n{report}"
        );
    }
    assert!(report.translated > PACKETS / 10, "{report}");
    // IPv6 gets the same treatment: a third to a half of the packets, translated both
    // ways, ICMPv6 errors and later fragments among them.
    let v6 = &report.ipv6;
    assert!(
        (PACKETS / 3..=PACKETS / 2).contains(&v6.packets),
        "IPv6 packets:\n{report}"
    );
    for (what, n, at_least) in [
        ("translated by XDP", v6.translated, PACKETS / 20),
        ("translated by TC", v6.tc_translated, 50),
        ("dropped", v6.dropped, 50),
        ("ICMPv6 errors translated", v6.icmp_translated, 20),
        (
            "later fragments translated",
            v6.later_fragments_translated,
            10,
        ),
    ] {
        assert!(
            n >= at_least,
            "IPv6 packets {what} below {at_least}:\n{report}"
        );
    }
    // SNAT flows of both families: both ends translated each way, on XDP's path and
    // the kernel's, and ICMP errors about them.
    let snat = &report.snat;
    for (what, n, at_least) in [
        (
            "forward packets given the node source by XDP",
            snat.forward,
            100,
        ),
        ("replies to the node address translated", snat.replies, 100),
        ("forward packets given the node source by TC", snat.masq, 10),
        ("ICMP errors translated", snat.icmp, 20),
        ("later fragments translated", snat.later_fragments, 5),
    ] {
        assert!(n >= at_least, "SNAT {what} below {at_least}:\n{report}");
    }
}

#[test]
fn random_and_mutated_packets_keep_the_datapath_invariants() {
    fuzz_one(SEED);
    if let Ok(seed) = std::env::var("BERTH_FUZZ_SEED") {
        let seed = match seed.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => seed.parse(),
        }
        .unwrap_or_else(|e| panic!("BERTH_FUZZ_SEED {seed:?}: {e}"));
        fuzz_one(seed);
    }
}
