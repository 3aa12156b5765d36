//! How the options parse, and what they refuse.

use super::{
    parse_announce_table, parse_conntrack_size, parse_max_services, parse_port_range, Cli, Command,
};
use clap::Parser as _;

/// Each `(input, what the error says)` of `cases` is refused by `parse`, saying that.
fn refuses<T: std::fmt::Debug>(parse: fn(&str) -> Result<T, String>, cases: &[(&str, &str)]) {
    for (bad, says) in cases {
        let err = parse(bad).expect_err(bad);
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn conntrack_size_is_a_positive_count_up_to_2_to_the_26() {
    assert_eq!(parse_conntrack_size("1024"), Ok(1024));
    assert_eq!(parse_conntrack_size("67108864"), Ok(1 << 26));
    refuses(
        parse_conntrack_size,
        &[
            ("0", "0 entries"),
            ("67108865", "beyond the 67108864"),
            ("99999999999", "beyond"),
            ("-1", "not a number"),
            ("1k", "not a number"),
        ],
    );
}

#[test]
fn max_services_goes_up_to_2_to_the_20() {
    assert_eq!(parse_max_services("131072"), Ok(1 << 17));
    assert_eq!(parse_max_services("1048576"), Ok(1 << 20));
    refuses(
        parse_max_services,
        &[("0", "0 services"), ("1048577", "beyond the 1048576")],
    );
}

fn run_args(extra: &[&str]) -> Result<super::RunArgs, clap::Error> {
    let mut argv = vec!["berth", "run", "--manifests", "m"];
    argv.extend(extra);
    match Cli::try_parse_from(argv)?.command {
        Command::Run(args) => Ok(*args),
        _ => unreachable!("berth run parses as Run"),
    }
}

#[test]
fn conntrack_size_and_new_flow_limit_default_and_parse() {
    let args = run_args(&[]).expect("defaults");
    assert_eq!(args.conntrack_size, 262_144);
    assert_eq!(args.new_flow_limit, 125_000);
    let args =
        run_args(&["--conntrack-size", "1024", "--new-flow-limit", "0"]).expect("both given");
    assert_eq!((args.conntrack_size, args.new_flow_limit), (1024, 0));
    let err = run_args(&["--conntrack-size", "0"])
        .err()
        .expect("0 is refused");
    assert!(err.to_string().contains("--conntrack-size"), "{err}");
    assert!(run_args(&["--new-flow-limit", "-5"]).is_err());
}

#[test]
fn replies_must_come_from_their_backend_unless_told_otherwise() {
    use super::ReplyOrigin;
    let origin = |extra: &[&str]| run_args(extra).map(|a| a.reply_origin).ok();
    assert_eq!(origin(&[]), Some(ReplyOrigin::Backend));
    assert_eq!(origin(&["--reply-origin", "any"]), Some(ReplyOrigin::Any));
    assert_eq!(
        origin(&["--reply-origin", "backend"]),
        Some(ReplyOrigin::Backend)
    );
    assert_eq!(origin(&["--reply-origin", "router"]), None);
}

#[test]
fn address_takes_either_family_once_per_family() {
    use berth::planner::DefaultAddresses;
    let defaults = |extra: &[&str]| {
        let args = run_args(extra).map_err(|e| e.to_string())?;
        DefaultAddresses::from_list(&args.addresses).map_err(|e| e.to_string())
    };
    assert_eq!(defaults(&[]), Ok(DefaultAddresses::default()));
    let both = defaults(&["--address", "2001:DB8::1", "--address", "192.0.2.1"])
        .expect("one address per family");
    assert_eq!(both.ipv4, Some("192.0.2.1".parse().expect("v4")));
    assert_eq!(both.ipv6, Some("2001:db8::1".parse().expect("v6")));
    let v6 = defaults(&["--address", "fd00::1"]).expect("IPv6 alone");
    assert_eq!(
        (v6.ipv4, v6.ipv6.map(|a| a.to_string())),
        (None, Some("fd00::1".into()))
    );
    let twice = defaults(&["--address", "192.0.2.1", "--address", "192.0.2.2"])
        .expect_err("two IPv4 addresses");
    assert!(
        twice.contains("--address is given twice for IPv4"),
        "{twice}"
    );
    let bad = defaults(&["--address", "gw.example.com"]).expect_err("not an IP");
    assert!(bad.contains("--address"), "{bad}");
}

#[test]
fn announce_options_default_and_the_kernels_tables_are_refused() {
    let args = run_args(&[]).expect("defaults");
    assert_eq!(args.announce_table, None);
    assert_eq!(args.not_ready_grace, std::time::Duration::from_secs(10));
    assert_eq!(args.drain_timeout, std::time::Duration::from_secs(30));
    assert!(!args.drain_on_stop);
    let args = run_args(&[
        "--announce-table",
        "100",
        "--drain-on-stop",
        "--drain-timeout",
        "2s",
        "--not-ready-grace",
        "500ms",
    ])
    .expect("all given");
    assert_eq!(args.announce_table, Some(100));
    assert!(args.drain_on_stop);
    assert_eq!(args.drain_timeout, std::time::Duration::from_secs(2));
    assert_eq!(args.not_ready_grace, std::time::Duration::from_millis(500));
    assert_eq!(parse_announce_table("256"), Ok(256));
    refuses(
        parse_announce_table,
        &[
            ("0", "unspec"),
            ("253", "default table"),
            ("254", "main table"),
            ("255", "local table"),
            ("-1", "not a routing table number"),
        ],
    );
    let err = run_args(&["--announce-table", "254"])
        .err()
        .expect("refused");
    assert!(err.to_string().contains("--announce-table"), "{err}");
}

#[test]
fn snat_ports_are_lo_hi_with_both_above_zero_and_in_order() {
    assert_eq!(parse_port_range("32768-60999"), Ok(32768..=60999));
    assert_eq!(parse_port_range("5000-5000"), Ok(5000..=5000));
    refuses(
        parse_port_range,
        &[
            ("60999-32768", "above the last"),
            ("0-100", "port 0"),
            ("100", "not LO-HI"),
            ("100-70000", "not a port"),
            ("a-b", "not a port"),
        ],
    );
}
