//! The operator's views of a daemon carrying traffic (issue 31): `berth get addresses`
//! sums each gateway address's routes and says the kernel's path once per address, and
//! `berth get routes` says that reason once per address at its end rather than on each
//! row; `berth get listeners` and `berth get backends` list the range and the
//! backends. The tables are printed (`--nocapture`) as the README shows them. Needs
//! root.

use std::{net::SocketAddrV4, time::Duration};

use berth_tests::{
    daemon::{berth_binary, Daemon, Dirs},
    netns::{poll, Netns},
    topo::{dns_whoami_from, http_get, Topology, GW},
};

/// `berth get WHAT` in `gateway` (a table).
fn get(gateway: &Netns, what: &str) -> String {
    let out = gateway
        .command(&berth_binary())
        .args(["get", what])
        .output()
        .expect("berth get");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn addresses_sum_their_routes_and_say_the_kernels_path_once() {
    // Team A's web on backends 1 and 2, team B's DNS on backend 3.
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    let daemon = Daemon::start(&topo, &dirs);
    let web = SocketAddrV4::new(GW, 30000);
    let dns = SocketAddrV4::new(GW, 30053);
    // Traffic on both routes, until the counters show the kernel's path on both: the
    // replies', as the backends' veths run no XDP (the requests are handed to TC).
    const WHY: &str = "forwarded by the kernel: replies arrive where XDP does not run";
    let addresses = poll(
        "both protocols forwarded by the kernel",
        Duration::from_secs(30),
        || {
            for _ in 0..5 {
                let _ = topo.client.enter(|| http_get(web));
                let _ = topo
                    .client
                    .enter(|| dns_whoami_from(dns, Duration::from_secs(1)));
            }
            let table = get(&topo.gateway, "addresses");
            let kernel = table.matches(WHY).count();
            if kernel == 2 {
                Ok(table)
            } else {
                Err(table)
            }
        },
    );
    eprintln!("$ berth get addresses\n{addresses}");
    for protocol in ["TCP", "UDP"] {
        let row = addresses
            .lines()
            .find(|l| l.starts_with(&GW.to_string()) && l.contains(protocol))
            .unwrap_or_else(|| panic!("{protocol} row: {addresses}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[2], "1", "one route: {row}");
        assert!(cells[3].parse::<u64>().unwrap_or(0) > 0, "packets: {row}");
        assert_eq!(cells.last(), Some(&"kernel"), "{row}");
    }
    let routes = get(&topo.gateway, "routes");
    eprintln!("$ berth get routes\n{routes}");
    assert!(
        !routes.contains("  ↳ forwarded by the kernel"),
        "no row repeats it: {routes}"
    );
    assert_eq!(
        routes.matches(WHY).count(),
        2,
        "once per address and protocol, at the end: {routes}"
    );
    let listeners = get(&topo.gateway, "listeners");
    eprintln!("$ berth get listeners\n{listeners}");
    assert!(listeners.contains("30000-30999"), "{listeners}");
    let backends = get(&topo.gateway, "backends");
    eprintln!("$ berth get backends\n{backends}");
    for b in &topo.backend_addrs[..2] {
        assert!(backends.contains(&format!("{b}:8080")), "{backends}");
    }
    assert!(
        backends.contains(&format!("{}:5353", topo.backend_addrs[2])),
        "{backends}"
    );
    drop(daemon);
}
