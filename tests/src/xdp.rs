//! Running the gateway program with `BPF_PROG_TEST_RUN` inside a namespace whose
//! routes and neighbours make its FIB lookups deterministic.

use std::path::PathBuf;

use aya::programs::{ProgramError, TestRun, TestRunOptions, TestRunResult};
use berth::datapath::{Config, Datapath, Limits, PROGRAM};

use crate::netns::{unique, Netns};

/// XDP verdict: the program dropped the packet.
pub const XDP_DROP: u32 = 1;
/// XDP verdict: the packet goes up to the kernel stack.
pub const XDP_PASS: u32 = 2;
/// XDP verdict: the packet goes back out of the interface it came in on.
pub const XDP_TX: u32 = 3;
/// XDP verdict: the packet goes out of the interface `bpf_redirect` chose.
pub const XDP_REDIRECT: u32 = 4;

/// Name of a verdict for messages.
pub fn verdict_name(v: u32) -> &'static str {
    match v {
        0 => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "unknown",
    }
}

/// Small map sizes for tests.
pub fn test_limits() -> Limits {
    Limits {
        services: 64,
        backends: 256,
        flows: 4096,
        fragments: 64,
        addresses: 8,
    }
}

/// A datapath loaded with its own pin directory, removed on drop.
pub struct TestDatapath {
    /// The loaded datapath (maps, programs), as the daemon holds it.
    pub dp: Datapath,
    /// Where its maps are pinned (under bpffs).
    pub pin_dir: PathBuf,
    limits: Limits,
    /// The object loaded instead of the embedded one (`load_object`).
    object: Option<Vec<u8>>,
}

impl TestDatapath {
    /// Loads the datapath with `test_limits()`; panics if the kernel refuses it.
    pub fn load() -> Self {
        Self::load_with(test_limits())
    }

    /// Loads the datapath with the given map sizes; panics if the kernel refuses it.
    pub fn load_with(limits: Limits) -> Self {
        Self::load_as(limits, None)
    }

    /// Loads `object` (an ELF object of the gateway program, such as another commit's
    /// build) instead of the embedded one, with the given map sizes and a pin directory
    /// of its own; panics if its maps differ from this build's or the kernel refuses it.
    pub fn load_object(limits: Limits, object: Vec<u8>) -> Self {
        Self::load_as(limits, Some(object))
    }

    fn load_as(limits: Limits, object: Option<Vec<u8>>) -> Self {
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/berth-test-{}", unique("dp")));
        let dp = Self::datapath(&pin_dir, limits, object.as_deref()).unwrap_or_else(|e| {
            // Maps may be pinned already when the program fails to load.
            let _ = berth::datapath::remove_pins(&pin_dir);
            panic!("loading datapath: {}", berth::error_chain(&e))
        });
        TestDatapath {
            dp,
            pin_dir,
            limits,
            object,
        }
    }

    /// The datapath of `object` (the embedded one when none) pinned in `pin_dir`.
    fn datapath(
        pin_dir: &std::path::Path,
        limits: Limits,
        object: Option<&[u8]>,
    ) -> Result<Datapath, berth::datapath::DatapathError> {
        let config = Config {
            pin_dir: pin_dir.to_path_buf(),
            limits,
        };
        match object {
            Some(object) => Datapath::load_object(&config, object),
            None => Datapath::load(&config),
        }
    }

    /// Loads the datapath again on the same pins, as a restarted daemon does: the new
    /// one adopts the maps (services, backends, conntrack) the old one left.
    pub fn restart(&mut self) {
        self.dp = Self::datapath(&self.pin_dir, self.limits, self.object.as_deref())
            .unwrap_or_else(|e| panic!("reloading datapath: {}", berth::error_chain(&e)));
    }
}

impl TestDatapath {
    /// Lets the program redirect into exactly these interfaces (what the daemon learns
    /// from the kernel's `xdp-features`).
    pub fn allow_redirect(&self, ifindexes: &[u32]) {
        let egress: Vec<_> = ifindexes
            .iter()
            .map(|&i| (i, berth::datapath::Egress::Xdp))
            .collect();
        self.set_xmit(&egress, &[]);
    }

    /// Says how packets leave by each interface (`egress`) and on which ones the TC
    /// hand-off program is attached (`handoff_in`), as the daemon's xmit thread does.
    pub fn set_xmit(&self, egress: &[(u32, berth::datapath::Egress)], handoff_in: &[u32]) {
        let mut xmit = berth::datapath::XmitMap::open(&self.pin_dir)
            .unwrap_or_else(|e| panic!("opening the xmit map: {}", berth::error_chain(&e)));
        xmit.set(
            &egress.iter().copied().collect(),
            &handoff_in.iter().copied().collect(),
        )
        .unwrap_or_else(|e| panic!("setting the xmit map: {}", berth::error_chain(&e)));
    }
}

/// The conntrack map of one family of a test datapath, opened from its pin: IPv4's
/// (`u32` addresses) by default, IPv6's with `[u32; 4]`.
pub type Conntrack<A = u32> =
    aya::maps::HashMap<aya::maps::MapData, gateway_common::FlowKey<A>, gateway_common::Flow<A>>;

/// The entry `map` holds under the tuple (`src`, `dst`, `proto`), if any (none for
/// addresses of another family).
pub fn conntrack_entry<A: berth::datapath::MapAddr>(
    map: &Conntrack<A>,
    src: std::net::SocketAddr,
    dst: std::net::SocketAddr,
    proto: u8,
) -> Option<gateway_common::Flow<A>> {
    let key = gateway_common::FlowKey {
        src: A::of(src.ip())?,
        dst: A::of(dst.ip())?,
        sport: src.port().to_be(),
        dport: dst.port().to_be(),
        proto,
        pad: [0; 3],
    };
    map.get(&key, 0).ok()
}

impl TestDatapath {
    /// The IPv4 conntrack map, to ask whether a tuple is tracked (opened from its pin, so
    /// it follows the map's key and value types).
    pub fn conntrack(&self) -> Conntrack {
        self.conntrack_of(gateway_common::map_names::CONNTRACK)
    }

    /// The IPv6 conntrack map (see `conntrack`).
    pub fn conntrack6(&self) -> Conntrack<[u32; 4]> {
        self.conntrack_of(gateway_common::map_names::CONNTRACK6)
    }

    fn conntrack_of<A: gateway_common::Addr + aya::Pod>(&self, name: &str) -> Conntrack<A> {
        let path = self.pin_dir.join(name);
        let map = aya::maps::MapData::from_pin(&path)
            .and_then(aya::maps::Map::from_map_data)
            .and_then(Conntrack::try_from)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        map
    }
}

impl Drop for TestDatapath {
    fn drop(&mut self) {
        let _ = berth::datapath::remove_pins(&self.pin_dir);
    }
}

/// Runs `program` once on `input` as if received on `ingress_ifindex` (0: loopback).
/// Must be called on a thread inside the namespace owning that interface.
pub fn run(
    dp: &mut Datapath,
    program: &'static str,
    ingress_ifindex: u32,
    input: &[u8],
) -> (u32, Vec<u8>) {
    // struct xdp_md { data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex }
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(input.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    let ctx = (ingress_ifindex != 0).then_some(&ctx[..]);
    let prog = dp.program_mut(program).expect("program");
    test_run(input, ctx, |opts| prog.test_run(opts))
}

/// One `BPF_PROG_TEST_RUN` on `input` through `run` (a program's `test_run`): its
/// return value and output frame.
fn test_run(
    input: &[u8],
    ctx: Option<&[u8]>,
    run: impl FnOnce(TestRunOptions<'_>) -> Result<TestRunResult, ProgramError>,
) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; input.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        ctx_in: ctx,
        ..TestRunOptions::default()
    };
    let result = run(opts).unwrap_or_else(|e| panic!("test_run: {}", berth::error_chain(&e)));
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

/// TC verdict "next program" (`TC_ACT_UNSPEC`), as test_run returns it.
pub const TC_NEXT: u32 = u32::MAX;

/// Runs the TC egress program once on `input` (an Ethernet frame).
pub fn run_tc(dp: &mut Datapath, input: &[u8]) -> (u32, Vec<u8>) {
    let prog = dp.tc_program_mut().expect("tc program");
    test_run(input, None, |opts| prog.test_run(opts))
}

/// Runs the TC hand-off program (`berth_tc_in`) once on `input`, as received on the
/// interface whose ingress it holds.
pub fn run_tc_in(dp: &mut Datapath, input: &[u8]) -> (u32, Vec<u8>) {
    let prog = dp
        .classifier_mut(berth::datapath::TC_INGRESS_PROGRAM)
        .expect("tc ingress program");
    test_run(input, None, |opts| prog.test_run(opts))
}

/// TC verdict "redirect" (`TC_ACT_REDIRECT`).
pub const TC_REDIRECT: u32 = 7;

/// TC verdict "drop" (`TC_ACT_SHOT`).
pub const TC_SHOT: u32 = 2;

/// Runs the TC egress program once on `input` as if the kernel had received it on
/// `ingress_ifindex` (`__sk_buff.ingress_ifindex`; 0: the host's own packet). Must be
/// called on a thread inside the namespace owning that interface.
pub fn run_tc_from(dp: &mut Datapath, ingress_ifindex: u32, input: &[u8]) -> (u32, Vec<u8>) {
    // struct __sk_buff: ingress_ifindex at offset 36; every field before it zero.
    let mut ctx = [0u8; 40];
    ctx[36..40].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    let prog = dp.tc_program_mut().expect("tc program");
    test_run(input, Some(&ctx), |opts| prog.test_run(opts))
}

/// Runs the gateway program (see `run`).
pub fn run_gateway(dp: &mut Datapath, ingress_ifindex: u32, input: &[u8]) -> (u32, Vec<u8>) {
    run(dp, PROGRAM, ingress_ifindex, input)
}

/// Addresses of the fixture network (all inside the fixture namespace).
pub mod net {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

    /// The gateway address the services listen on.
    pub const GW: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 100);
    /// The client, on fx0's subnet.
    pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 10);
    /// The client's MAC (static neighbour entry on fx0).
    pub const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 1, 0x10];
    /// MAC of fx0, the client-side interface.
    pub const FX0_MAC: [u8; 6] = [2, 0, 0, 0, 1, 1];
    /// MAC of fx1, the backend-side interface.
    pub const FX1_MAC: [u8; 6] = [2, 0, 0, 0, 2, 1];
    /// Backends with static neighbour entries on fx1.
    pub const B1: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 10);
    /// Second backend with a static neighbour entry on fx1.
    pub const B2: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 11);
    /// Third backend with a static neighbour entry on fx1.
    pub const B3: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 12);
    /// A backend on fx1's subnet with no neighbour entry.
    pub const B_NO_NEIGH: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 20);
    /// A backend on the client side (fx0).
    pub const B_SAME_SIDE: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 50);
    /// MAC of `B_SAME_SIDE` (static neighbour entry on fx0).
    pub const B_SAME_SIDE_MAC: [u8; 6] = [2, 0, 0, 0, 1, 0x50];

    /// The MAC of the neighbour entry the fixture gives a backend address.
    pub fn mac_of(backend: Ipv4Addr) -> [u8; 6] {
        let o = backend.octets();
        [2, 0, 0, 0, o[2], o[3]]
    }

    /// fx0's IPv4 address (client side).
    pub const FX0_4: Ipv4Addr = Ipv4Addr::new(10, 250, 1, 1);
    /// fx1's IPv4 address (backend side): the node's address toward the backends.
    pub const FX1_4: Ipv4Addr = Ipv4Addr::new(10, 250, 2, 1);

    /// The IPv6 gateway address the IPv6 services listen on.
    pub const GW6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0x64);
    /// fx0's IPv6 address (client side).
    pub const FX0_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 1);
    /// fx1's IPv6 address (backend side): the node's address toward the backends.
    pub const FX1_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 1);
    /// The IPv6 client, on fx0's subnet (neighbour MAC `CLIENT_MAC`).
    pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 1, 0, 0, 0, 0, 10);
    /// IPv6 backends with static neighbour entries on fx1 (the MACs of `B1`, `B2`,
    /// `B3`: `mac_of6`).
    pub const B1_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 10);
    /// Second IPv6 backend.
    pub const B2_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 11);
    /// Third IPv6 backend.
    pub const B3_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 2, 0, 0, 0, 0, 12);

    /// The MAC of the neighbour entry the fixture gives an IPv6 backend address: its
    /// IPv4 twin's (fd00:250:2::10 is 10.250.2.10's).
    pub fn mac_of6(backend: Ipv6Addr) -> [u8; 6] {
        let s = backend.segments();
        [2, 0, 0, 0, s[2] as u8, s[7] as u8]
    }

    /// The address-filter slot of `ip` (`gateway_common::addr_slot`), either family.
    pub fn filter_slot(ip: std::net::IpAddr) -> u32 {
        use gateway_common::addr_slot;
        match ip {
            std::net::IpAddr::V4(a) => addr_slot(u32::from(a).to_be()),
            std::net::IpAddr::V6(a) => {
                let o = a.octets();
                let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
                addr_slot([word(0), word(4), word(8), word(12)])
            }
        }
    }

    /// The first IPv6 address after `base` (counting up its last 32 bits) whose filter
    /// slot is `ip`'s: its packets are not passed on their roles alone, but walked and
    /// looked up (IPv6 slots are a hash, so such an address is found by searching).
    pub fn sharing_slot(base: Ipv6Addr, ip: std::net::IpAddr) -> Ipv6Addr {
        let want = filter_slot(ip);
        let base = u128::from(base);
        (1..=u32::MAX)
            .map(|n| Ipv6Addr::from(base + u128::from(n)))
            .find(|&a| a != ip && filter_slot(a.into()) == want)
            .expect("some address shares the slot")
    }

    /// Shorthand for `SocketAddrV6::new(ip, port, 0, 0)`.
    pub fn sa6(ip: Ipv6Addr, port: u16) -> SocketAddrV6 {
        SocketAddrV6::new(ip, port, 0, 0)
    }

    /// The IPv6 endpoint `e`.
    pub fn v6(e: std::net::SocketAddr) -> SocketAddrV6 {
        match e {
            std::net::SocketAddr::V6(e) => e,
            std::net::SocketAddr::V4(e) => panic!("an IPv6 endpoint expected, not {e}"),
        }
    }

    /// Shorthand for `SocketAddrV4::new(ip, port)`.
    pub fn sa(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(ip, port)
    }

    /// The IPv4 endpoint `e`: the fixtures are IPv4 (the kernel program serves IPv4
    /// only yet).
    pub fn v4(e: std::net::SocketAddr) -> SocketAddrV4 {
        match e {
            std::net::SocketAddr::V4(e) => e,
            std::net::SocketAddr::V6(e) => panic!("the fixtures are IPv4 only, not {e}"),
        }
    }
}

/// A namespace with two veth pairs standing for the client side (fx0) and the backend
/// side (fx1) of a gateway, IPv4 and IPv6 addresses, static neighbours of both families
/// and forwarding on.
pub struct FixtureNet {
    /// The namespace holding both veth pairs.
    pub ns: Netns,
    /// Interface index of fx0 (client side).
    pub fx0: u32,
    /// Interface index of fx1 (backend side).
    pub fx1: u32,
}

impl FixtureNet {
    /// Gives `ip` (either family) a permanent neighbour entry with `mac` on `dev`.
    pub fn neighbour(&self, ip: std::net::IpAddr, mac: [u8; 6], dev: &str) {
        let family = if ip.is_ipv6() { "-6" } else { "-4" };
        let (ip, mac) = (ip.to_string(), mac.map(|b| format!("{b:02x}")).join(":"));
        self.ns.ip(&[
            family,
            "neigh",
            "replace",
            &ip,
            "lladdr",
            &mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ]);
    }

    /// Creates the namespace, both veth pairs, addresses and static neighbours.
    pub fn new() -> Self {
        use net::*;
        let ns = Netns::new("fx");
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        for (dev, peer, m, addr, addr6) in [
            ("fx0", "fx0p", FX0_MAC, FX0_4, FX0_6),
            ("fx1", "fx1p", FX1_MAC, FX1_4, FX1_6),
        ] {
            ns.ip(&[
                "link",
                "add",
                dev,
                "address",
                &mac(m),
                "type",
                "veth",
                "peer",
                "name",
                peer,
            ]);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev]);
            // No duplicate address detection: usable at once.
            ns.ip(&["addr", "add", &format!("{addr6}/64"), "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
            ns.ip(&["link", "set", peer, "up"]);
        }
        let neigh = |ip: std::net::IpAddr, m: [u8; 6], dev: &str| {
            ns.ip(&[
                "neigh",
                "replace",
                &ip.to_string(),
                "lladdr",
                &mac(m),
                "dev",
                dev,
                "nud",
                "permanent",
            ]);
        };
        neigh(CLIENT.into(), CLIENT_MAC, "fx0");
        neigh(B_SAME_SIDE.into(), B_SAME_SIDE_MAC, "fx0");
        for b in [B1, B2, B3] {
            neigh(b.into(), mac_of(b), "fx1");
        }
        neigh(CLIENT6.into(), CLIENT_MAC, "fx0");
        for b in [B1_6, B2_6, B3_6] {
            neigh(b.into(), mac_of6(b), "fx1");
        }
        ns.sysctl("net.ipv4.ip_forward", "1");
        ns.sysctl("net.ipv6.conf.all.forwarding", "1");
        let fx0 = ns.ifindex("fx0");
        let fx1 = ns.ifindex("fx1");
        FixtureNet { ns, fx0, fx1 }
    }
}

impl Default for FixtureNet {
    fn default() -> Self {
        Self::new()
    }
}

/// The backend the kernel program's Maglev gives a flow from `src` to service `dst`
/// (either family) among `backends`, computed with the daemon's own table builder and
/// the hash the program uses (`gateway_common::flow_hash`); none when no backend takes
/// new flows. Every gateway with the same backends gives the same answer.
pub fn maglev_pick(
    backends: &[berth::datapath::WeightedBackend],
    src: std::net::SocketAddr,
    dst: std::net::SocketAddr,
    proto: u8,
) -> Option<std::net::SocketAddr> {
    use berth::datapath::{maglev, MapAddr};
    fn hash<A: MapAddr>(
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
        proto: u8,
    ) -> Option<u32> {
        let (s, d) = (A::of(src.ip())?, A::of(dst.ip())?);
        Some(gateway_common::flow_hash(
            s,
            d,
            src.port().to_be(),
            dst.port().to_be(),
            proto,
        ))
    }
    let candidates: Vec<maglev::Candidate> = backends
        .iter()
        .map(|b| maglev::Candidate {
            endpoint: b.endpoint,
            weight: b.weight,
        })
        .collect();
    // Sized as the daemon sizes it: by the backends taking new flows.
    let active = candidates.iter().filter(|c| c.weight > 0).count() as u32;
    let size = gateway_common::maglev_size(active);
    let table = maglev::table(&candidates, size)?;
    let h = hash::<u32>(src, dst, proto).or_else(|| hash::<[u32; 4]>(src, dst, proto))?;
    Some(candidates[table[(h % size) as usize] as usize].endpoint)
}
