//! The netlink module against the kernel (needs root). Each test makes its own network
//! namespace and calls the module from a thread that entered it, so the root
//! namespace's interfaces are never touched.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    os::fd::AsRawFd,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use berth::netlink::{self, LinkEvents, NetlinkError};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A network namespace, deleted when dropped (also when the test panics).
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        let name = format!(
            "berth-nl-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name]);
        Netns { name }
    }

    /// `ip -n NS ARGS`.
    fn ip(&self, args: &[&str]) {
        run("ip", &[&["-n", self.name.as_str()], args].concat());
    }

    /// `ip netns exec NS ARGS`.
    fn exec(&self, args: &[&str]) {
        run(
            "ip",
            &[&["netns", "exec", self.name.as_str()], args].concat(),
        );
    }

    /// Whether link `name` is administratively up.
    fn is_up(&self, name: &str) -> bool {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-o", "link", "show", name])
            .output()
            .expect("running ip");
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        line.split(['<', '>'])
            .nth(1)
            .is_some_and(|flags| flags.split(',').any(|f| f == "UP"))
    }

    /// A veth pair `a`–`b`, both up.
    fn veth(&self, a: &str, b: &str) {
        self.ip(&["link", "add", "name", a, "type", "veth", "peer", "name", b]);
        self.ip(&["link", "set", a, "up"]);
        self.ip(&["link", "set", b, "up"]);
    }

    /// Runs `f` on a thread that entered the namespace.
    fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: a valid namespace descriptor; setns only changes this thread.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn index_of(name: &str) -> u32 {
    let links = netlink::links().expect("links");
    links
        .iter()
        .find(|(_, n)| n.as_str() == name)
        .map(|(&i, _)| i)
        .unwrap_or_else(|| panic!("no link {name} in {links:?}"))
}

/// Polls `condition` for up to two seconds.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !condition() {
        assert!(Instant::now() < deadline, "{what} did not happen within 2s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn xmit() -> BTreeSet<u32> {
    netlink::xdp_xmit_interfaces().expect("xdp_xmit_interfaces")
}

#[test]
fn a_veth_advertises_ndo_xmit_only_while_its_peer_has_gro_on() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.ip(&["link", "add", "name", "br0", "type", "bridge"]);
    ns.enter(|| {
        let (va, vb, br0) = (index_of("va"), index_of("vb"), index_of("br0"));
        assert_eq!(xmit(), BTreeSet::new(), "nothing accepts redirects yet");

        ns.exec(&["ethtool", "-K", "vb", "gro", "on"]);
        eventually("va advertising ndo_xmit", || xmit().contains(&va));
        let now = xmit();
        assert!(!now.contains(&vb), "vb's own GRO does not matter: {now:?}");
        assert!(!now.contains(&br0), "a bridge never advertises: {now:?}");

        ns.exec(&["ethtool", "-K", "vb", "gro", "off"]);
        eventually("va withdrawing ndo_xmit", || !xmit().contains(&va));
    });
}

#[test]
fn link_events_report_a_peers_gro_change() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.enter(|| {
        let mut events = LinkEvents::new().expect("LinkEvents::new");
        while events.wait(Duration::from_millis(200)).expect("wait") {}
        assert!(!events.wait(Duration::from_millis(100)).expect("wait"));

        ns.exec(&["ethtool", "-K", "vb", "gro", "on"]);
        let started = Instant::now();
        assert!(
            events.wait(Duration::from_secs(2)).expect("wait"),
            "no notification after GRO on"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        while events.wait(Duration::from_millis(200)).expect("wait") {}

        ns.exec(&["ethtool", "-K", "vb", "gro", "off"]);
        assert!(
            events.wait(Duration::from_secs(2)).expect("wait"),
            "no notification after GRO off"
        );
    });
}

#[test]
fn link_events_report_a_new_link() {
    let ns = Netns::new();
    ns.enter(|| {
        let mut events = LinkEvents::new().expect("LinkEvents::new");
        while events.wait(Duration::from_millis(200)).expect("wait") {}
        ns.ip(&["link", "add", "name", "br0", "type", "bridge"]);
        assert!(events.wait(Duration::from_secs(2)).expect("wait"));
    });
}

/// The bridge `br0` with the veth `p0` as its port (its peer `q0` in the same
/// namespace), all up, and a static entry for `MAC` on `p0`.
const MAC: [u8; 6] = [0x02, 0xbe, 0, 0, 0, 0x11];
const MAC_TEXT: &str = "02:be:00:00:00:11";

fn bridge_with_a_port(ns: &Netns) {
    ns.ip(&["link", "add", "name", "br0", "type", "bridge"]);
    ns.veth("p0", "q0");
    ns.ip(&["link", "set", "p0", "master", "br0"]);
    ns.ip(&["link", "set", "br0", "up"]);
}

#[test]
fn a_bridges_ports_and_forwarding_database_are_read_and_their_changes_notified() {
    let ns = Netns::new();
    bridge_with_a_port(&ns);
    ns.enter(|| {
        let (br0, p0) = (index_of("br0"), index_of("p0"));
        let links = || netlink::ethernet_links().expect("ethernet_links");
        assert_eq!(links()[&br0].kind, netlink::EtherKind::Bridge);
        // A port forwards once the bridge and its carrier are up (no STP).
        eventually("p0 forwarding for br0", || {
            links()[&p0].port_of == Some(br0)
        });
        assert_eq!(links()[&index_of("q0")].port_of, None);

        let mut events = LinkEvents::new().expect("LinkEvents::new");
        while events.wait(Duration::from_millis(200)).expect("wait") {}
        ns.exec(&[
            "bridge", "fdb", "add", MAC_TEXT, "dev", "p0", "master", "static",
        ]);
        assert!(
            events.wait(Duration::from_secs(2)).expect("wait"),
            "no notification of the new forwarding-database entry"
        );
        let fdb = netlink::fdb().expect("fdb");
        let entry = fdb
            .iter()
            .find(|e| e.mac == MAC)
            .unwrap_or_else(|| panic!("no entry for {MAC_TEXT} in {fdb:?}"));
        assert_eq!((entry.port, entry.master), (p0, br0), "{entry:?}");
        assert!(
            entry.of_master && !entry.local && entry.vlan.is_none(),
            "{entry:?}"
        );
        assert!(
            fdb.iter().any(|e| e.port == p0 && e.local),
            "the bridge's own address on its port is there, and told apart: {fdb:?}"
        );

        while events.wait(Duration::from_millis(200)).expect("wait") {}
        ns.exec(&["bridge", "fdb", "del", MAC_TEXT, "dev", "p0", "master"]);
        assert!(
            events.wait(Duration::from_secs(2)).expect("wait"),
            "no notification of the removed entry"
        );
        assert!(!netlink::fdb().expect("fdb").iter().any(|e| e.mac == MAC));

        // VLAN filtering: this kernel has none (CONFIG_BRIDGE_VLAN_FILTERING), so the
        // netlink module's unit tests cover it.
    });
}

#[test]
fn ip_neighbour_changes_do_not_wake_the_link_events() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.enter(|| {
        let mut events = LinkEvents::new().expect("LinkEvents::new");
        while events.wait(Duration::from_millis(200)).expect("wait") {}
        ns.ip(&[
            "neigh",
            "add",
            "192.0.2.1",
            "lladdr",
            MAC_TEXT,
            "dev",
            "va",
            "nud",
            "permanent",
        ]);
        assert!(
            !events.wait(Duration::from_millis(300)).expect("wait"),
            "an IP neighbour entry is no forwarding-database change"
        );
    });
}

/// The alias the tests' dummy interfaces are marked with.
const MARK: &str = "berth pin-dir /sys/fs/bpf/berth-netlink-test";

#[test]
fn a_dummy_interface_is_created_once_holds_32_addresses_loses_them_and_is_deleted() {
    let ns = Netns::new();
    ns.enter(|| {
        // A dummy, or an ifb where the kernel has no dummy driver (this project's
        // machines): either holds addresses and carries no traffic.
        let index = netlink::ensure_dummy("berth0", MARK).expect("ensure_dummy");
        assert!(ns.is_up("berth0"), "created down");
        ns.ip(&["link", "set", "berth0", "down"]);
        assert_eq!(netlink::ensure_dummy("berth0", MARK).expect("again"), index);
        assert!(ns.is_up("berth0"), "not set up again");
        assert_eq!(index_of("berth0"), index);

        let (a, b) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        for addr in [a, b, a] {
            netlink::add_address(index, addr).expect("add");
        }
        let expected = BTreeSet::from([a, b]);
        assert_eq!(netlink::addresses(index).expect("addresses"), expected);

        netlink::remove_address(index, a).expect("remove");
        netlink::remove_address(index, a).expect("remove again");
        assert_eq!(
            netlink::addresses(index).expect("addresses"),
            BTreeSet::from([b])
        );

        // Marked as another pin directory's: left alone.
        assert_eq!(
            netlink::delete_dummy("berth0", "berth pin-dir /elsewhere", true).expect("kept"),
            netlink::DummyDeleted::Kept {
                alias: MARK.to_string()
            }
        );
        assert_eq!(
            netlink::delete_dummy("berth0", MARK, true).expect("delete"),
            netlink::DummyDeleted::Deleted
        );
        assert_eq!(
            netlink::delete_dummy("berth0", MARK, true).expect("delete again"),
            netlink::DummyDeleted::Absent
        );
        assert!(!netlink::links().expect("links").contains_key(&index));
    });
}

#[test]
fn addresses_are_added_once_listed_per_link_and_removed() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.ip(&["addr", "add", "198.51.100.7/24", "dev", "vb"]);
    ns.enter(|| {
        let va = index_of("va");
        let (a, b) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        for addr in [a, b, a] {
            netlink::add_address(va, addr).expect("add");
        }
        assert_eq!(
            netlink::addresses(va).expect("addresses"),
            BTreeSet::from([a, b])
        );
        assert_eq!(
            netlink::addresses(index_of("vb")).expect("addresses"),
            BTreeSet::from([IpAddr::from([198, 51, 100, 7])])
        );

        netlink::remove_address(va, a).expect("remove");
        netlink::remove_address(va, a).expect("remove again");
        assert_eq!(
            netlink::addresses(va).expect("addresses"),
            BTreeSet::from([b])
        );

        // IPv6: a /128 without duplicate address detection; the link's own link-local
        // address (fe80::/10) is never listed, so never removed.
        ns.ip(&["link", "set", "va", "up"]);
        let v6: IpAddr = "2001:db8::7".parse().expect("ip");
        netlink::add_address(va, v6).expect("add IPv6");
        netlink::add_address(va, v6).expect("add IPv6 again");
        assert_eq!(
            netlink::addresses(va).expect("addresses"),
            BTreeSet::from([b, v6])
        );
        let shown = std::process::Command::new("ip")
            .args(["-n", ns.name.as_str(), "-6", "addr", "show", "dev", "va"])
            .output()
            .expect("ip addr show");
        let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
        let line = shown
            .lines()
            .find(|l| l.contains("2001:db8::7/128"))
            .unwrap_or_else(|| panic!("no 2001:db8::7/128 in {shown}"));
        assert!(
            line.contains("nodad") && !line.contains("tentative"),
            "no DAD: {line}"
        );
        netlink::remove_address(va, v6).expect("remove IPv6");
        assert_eq!(
            netlink::addresses(va).expect("addresses"),
            BTreeSet::from([b])
        );
    });
}

#[test]
fn removing_a_32_leaves_the_same_address_with_another_prefix() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", "va"]);
    ns.enter(|| {
        let va = index_of("va");
        let addr = IpAddr::from([192, 0, 2, 1]);
        netlink::remove_address(va, addr).expect("remove");
        assert_eq!(
            netlink::addresses(va).expect("addresses"),
            BTreeSet::from([addr])
        );
    });
}

#[test]
fn ensure_dummy_refuses_a_name_held_by_a_non_dummy_link_and_leaves_it_alone() {
    let ns = Netns::new();
    ns.veth("va", "vb");
    ns.ip(&[
        "link",
        "property",
        "add",
        "dev",
        "vb",
        "altname",
        "berth-alt",
    ]);
    ns.enter(|| {
        let before = netlink::links().expect("links");
        let va = index_of("va");

        match netlink::ensure_dummy("va", MARK) {
            Err(NetlinkError::NotDummy { name, kind }) => {
                assert_eq!((name.as_str(), kind.as_deref()), ("va", Some("veth")))
            }
            other => panic!("ensure_dummy(va) = {other:?}"),
        }
        match netlink::delete_dummy("va", MARK, true) {
            Err(NetlinkError::NotDummy { .. }) => {}
            other => panic!("delete_dummy(va) = {other:?}"),
        }
        match netlink::ensure_dummy("berth-alt", MARK) {
            Err(NetlinkError::AltName { name, holder }) => {
                assert_eq!((name.as_str(), holder.as_str()), ("berth-alt", "vb"))
            }
            other => panic!("ensure_dummy(berth-alt) = {other:?}"),
        }

        assert_eq!(netlink::links().expect("links"), before);
        netlink::add_address(va, IpAddr::from([192, 0, 2, 9])).expect("va still works");
    });
}

#[test]
fn deleting_an_absent_dummy_reports_absent() {
    let ns = Netns::new();
    ns.enter(|| {
        assert_eq!(
            netlink::delete_dummy("berth0", MARK, true).expect("delete_dummy"),
            netlink::DummyDeleted::Absent
        );
        assert!(matches!(
            netlink::delete_dummy("no/slash", MARK, true),
            Err(NetlinkError::InvalidName { .. })
        ));
    });
}

/// `ip -n NS ARGS`, its standard output.
fn ip_output(ns: &Netns, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args([&["-n", ns.name.as_str()], args].concat())
        .output()
        .expect("running ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_proxy_neighbour_entry_answers_solicitations_from_the_segment_until_removed() {
    let (gw, client) = (Netns::new(), Netns::new());
    gw.ip(&[
        "link",
        "add",
        "va",
        "type",
        "veth",
        "peer",
        "name",
        "vb",
        "netns",
        &client.name,
    ]);
    gw.ip(&["link", "set", "va", "up"]);
    client.ip(&["link", "set", "vb", "up"]);
    gw.ip(&["addr", "add", "2001:db8::1/64", "dev", "va", "nodad"]);
    client.ip(&["addr", "add", "2001:db8::2/64", "dev", "vb", "nodad"]);
    gw.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    let target: std::net::Ipv6Addr = "2001:db8::100".parse().expect("ip");
    gw.enter(|| {
        let va = index_of("va");
        netlink::add_proxy_neighbour(va, target).expect("add");
        netlink::add_proxy_neighbour(va, target).expect("add again");
        let changed = berth::host::enable_proxy_ndp(&["va".to_string()]).expect("proxy_ndp");
        assert_eq!(changed, ["net.ipv6.conf.va.proxy_ndp"]);
    });
    let link = ip_output(&gw, &["-o", "link", "show", "va"]);
    let va_mac = link
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {link}"))
        .to_string();
    assert!(
        ip_output(&gw, &["-6", "neigh", "show", "proxy"]).contains("2001:db8::100 dev va"),
        "the proxy entry is listed"
    );
    // A datagram to the target makes the client solicit it; the gateway answers.
    client.enter(|| {
        let socket = std::net::UdpSocket::bind("[::]:0").expect("bind");
        eventually("the client learns the target's link address", || {
            let _ = socket.send_to(b"x", (target, 9));
            ip_output(&client, &["-6", "neigh", "show", "2001:db8::100"])
                .contains(&format!("lladdr {va_mac}"))
        });
    });
    gw.enter(|| {
        let va = index_of("va");
        netlink::remove_proxy_neighbour(va, target).expect("remove");
        netlink::remove_proxy_neighbour(va, target).expect("remove again");
    });
    assert_eq!(ip_output(&gw, &["-6", "neigh", "show", "proxy"]).trim(), "");
}

/// The routes of table 100 as `ip -N route show` prints them (both families, protocols
/// and scopes as numbers: iproute2 names 251 after the host's rt_protos), one a line.
fn table_100(ns: &Netns) -> Vec<String> {
    ["-4", "-6"]
        .iter()
        .flat_map(|family| {
            ip_output(ns, &["-N", family, "route", "show", "table", "100"])
                .lines()
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn host_routes_of_our_protocol_are_added_listed_and_removed_and_no_other_route_is_touched() {
    use netlink::{HostRoute, RouteAdded, RTPROT_BERTH};
    let ns = Netns::new();
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "add", "d0", "type", "veth", "peer", "name", "d1"]);
    ns.ip(&["link", "set", "d0", "up"]);
    // Another protocol's routes in the table (static, and one to an address Berth will
    // try to publish), ours in another table, and a route of ours that is no host route.
    for (dst, table, proto) in [
        ("192.0.2.9/32", "100", "static"),
        ("192.0.2.1/32", "100", "static"),
        ("192.0.2.1/32", "101", "251"),
        ("192.0.2.0/24", "100", "251"),
    ] {
        ns.ip(&[
            "route", "add", dst, "dev", "d0", "table", table, "proto", proto,
        ]);
    }
    let ours = |addr: &str| HostRoute {
        table: 100,
        protocol: RTPROT_BERTH,
        addr: addr.parse().expect("ip"),
    };
    ns.enter(|| {
        assert_eq!(
            netlink::host_routes(100, RTPROT_BERTH).expect("dump"),
            BTreeSet::new(),
            "a /24 of our protocol is not a host route"
        );
        assert_eq!(
            netlink::host_routes(102, RTPROT_BERTH).expect("dump of a table with no route"),
            BTreeSet::new()
        );
        let d0 = index_of("d0");
        let lo = index_of("lo");
        assert_eq!(
            netlink::add_host_route(ours("192.0.2.10"), d0).expect("add"),
            RouteAdded::Added
        );
        assert_eq!(
            netlink::add_host_route(ours("2001:db8::10"), lo).expect("add v6"),
            RouteAdded::Added
        );
        assert_eq!(
            netlink::add_host_route(ours("192.0.2.10"), d0).expect("add again"),
            RouteAdded::Exists
        );
        assert_eq!(
            netlink::add_host_route(ours("192.0.2.1"), d0).expect("add over a static route"),
            RouteAdded::Exists,
            "a route of another protocol to the address is never replaced"
        );
        let want: BTreeSet<IpAddr> = ["192.0.2.10", "2001:db8::10"]
            .iter()
            .map(|a| a.parse().expect("ip"))
            .collect();
        assert_eq!(netlink::host_routes(100, RTPROT_BERTH).expect("dump"), want);
    });
    let routes = table_100(&ns);
    assert!(
        routes
            .iter()
            .any(|r| r.starts_with("192.0.2.10 dev d0 proto 251 scope 253")),
        "ADDR dev DEV proto 251 scope link: {routes:?}"
    );
    assert!(
        routes
            .iter()
            .any(|r| r.starts_with("2001:db8::10 dev lo proto 251")),
        "{routes:?}"
    );
    ns.enter(|| {
        // Removing names the protocol: the static route to 192.0.2.1 stays.
        netlink::remove_host_route(ours("192.0.2.1")).expect("remove another's");
        netlink::remove_host_route(ours("192.0.2.10")).expect("remove");
        netlink::remove_host_route(ours("192.0.2.10")).expect("remove again");
        netlink::remove_host_route(ours("2001:db8::10")).expect("remove v6");
        assert_eq!(
            netlink::host_routes(100, RTPROT_BERTH).expect("dump"),
            BTreeSet::new()
        );
    });
    let routes = table_100(&ns);
    for kept in [
        "192.0.2.9 dev d0 proto 4",
        "192.0.2.1 dev d0 proto 4",
        "192.0.2.0/24 dev d0 proto 251",
    ] {
        assert!(
            routes.iter().any(|r| r.starts_with(kept)),
            "{kept} is gone: {routes:?}"
        );
    }
    assert!(
        ip_output(&ns, &["-N", "route", "show", "table", "101"])
            .contains("192.0.2.1 dev d0 proto 251"),
        "another table is never touched"
    );
}
