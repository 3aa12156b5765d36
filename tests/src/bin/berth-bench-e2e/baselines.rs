//! The gateway under test, set up per mode: Berth (`berth run` on a route to the
//! backends), Berth in SNAT mode (`berth-dp-loader` with the service source-NATed), the
//! netfilter DNAT baselines (iptables-legacy, iptables-nft, nftables), IPVS and iptables
//! DNAT + MASQUERADE; in IPv6 (`Family::V6`) Berth on the Gateway's IPv6 address too,
//! ip6tables and nftables' ip6 family, no IPVS or SNAT mode.

use super::*;

/// The bench's UDPRoute, its Service and the EndpointSlice of `backends` (of one
/// family).
pub(super) fn route_yaml(backends: &[IpAddr]) -> String {
    let endpoints: String = backends
        .iter()
        .map(|a| format!("- addresses: [\"{a}\"]\n"))
        .collect();
    let family = if backends.iter().all(IpAddr::is_ipv4) {
        "IPv4"
    } else {
        "IPv6"
    };
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\nmetadata: {{name: bench, namespace: bench}}\n\
         spec:\n  parentRefs: [{{name: shared, namespace: infra, port: {GW_PORT}}}]\n  \
         rules: [{{backendRefs: [{{name: sink, port: 53}}]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: sink, namespace: bench}}\n\
         spec: {{ports: [{{name: udp, port: 53, protocol: UDP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: sink-1, namespace: bench, labels: {{kubernetes.io/service-name: sink}}}}\n\
         addressType: {family}\nendpoints:\n{endpoints}ports: [{{name: udp, port: {BACKEND_PORT}, protocol: UDP}}]\n"
    )
}

/// The SNAT port range of the SNAT-mode row (the daemon's default, 32768-60999).
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 32768..=60999;

/// What keeps a mode's gateway running (Berth's daemon or loader), to drop (kill,
/// unpin) before the topology.
pub(super) type Running = Box<dyn std::any::Any>;

/// Sets the gateway up for `mode`, its service on `family`'s gateway address.
pub(super) fn configure(mode: Mode, topo: &Topology, family: Family) -> Option<Running> {
    assert!(
        family.runs(mode),
        "{} takes no {} load",
        mode.name(),
        family.name()
    );
    let gw = &topo.gateway;
    let addr = |i: usize| family.backends(topo)[i - 1];
    if matches!(mode, Mode::BerthSnat | Mode::IptablesMasq) {
        // Source NAT serves backends that do not route via the gateway: take their
        // default route away (they reach the gateway's address on their subnet).
        for b in &topo.backends {
            b.ip(&["route", "del", "default"]);
        }
    }
    match mode {
        Mode::Routing => {}
        Mode::Berth | Mode::BerthKernel => return Some(berth(mode, topo, family)),
        Mode::BerthSnat => {
            let service = ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Udp,
                port: GW_PORT,
            };
            let backends = (1..=BACKENDS)
                .map(|i| WeightedBackend {
                    endpoint: SocketAddr::new(addr(i), BACKEND_PORT),
                    weight: 1,
                })
                .collect();
            let state = DesiredState::default()
                .with_snat_service(service, backends)
                .with_snat_ports(vec![SNAT_PORTS]);
            // As `berth run` by default: redirect into interfaces that take XDP frames,
            // maps of the default sizes (the new-flow load fills the conntrack).
            let loader = Loader::start(
                gw,
                &topo.gateway_ifaces,
                &state,
                &["--follow-xmit", "--default-limits"],
            );
            return Some(Box::new(loader));
        }
        Mode::IptablesLegacy | Mode::IptablesNft | Mode::IptablesMasq => {
            iptables(mode, topo, family)
        }
        Mode::Ipvs => {
            // IPVS answers addresses of this host: put the gateway address on lo.
            gw.ip(&["addr", "add", &format!("{GW}/32"), "dev", "lo"]);
            let vip = format!("{GW}:{GW_PORT}");
            gw.exec(&["ipvsadm", "-A", "-u", &vip, "-s", "rr"]);
            for i in 1..=BACKENDS {
                gw.exec(&[
                    "ipvsadm",
                    "-a",
                    "-u",
                    &vip,
                    "-r",
                    &backend_at(topo, family, i),
                    "-m",
                ]);
            }
        }
        Mode::Nftables => nftables(topo, family),
    }
    None
}

/// `berth run` (`--redirect never` for `BerthKernel`) serving the bench route on
/// `family`'s gateway address, once it has its port and backends.
fn berth(mode: Mode, topo: &Topology, family: Family) -> Running {
    let gw = &topo.gateway;
    let dirs = Dirs::with_example_files(&["gateway.yaml"]);
    if family == Family::V6 {
        // The Gateway dual-stack, as the dual-stack tests make it.
        let v4 = format!("    value: {GW}\n");
        let v6 = format!("{v4}  - type: IPAddress\n    value: {GW6}\n");
        dirs.edit_manifest("gateway.yaml", &v4, &v6);
    }
    std::fs::write(
        dirs.manifests.join("bench.yaml"),
        route_yaml(&family.backends(topo)),
    )
    .expect("write");
    let extra: &[&str] = if mode == Mode::BerthKernel {
        &["--redirect", "never"]
    } else {
        &[]
    };
    let daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, extra);
    wait_until(
        "the bench route's port and backends in berth",
        Duration::from_secs(20),
        || {
            daemon.routes(gw).iter().any(|r| {
                r.name == "bench"
                    && r.port == Some(GW_PORT)
                    && r.backends == BACKENDS
                    && r.addresses.contains(&family.gateway())
            })
        },
    );
    Box::new((daemon, dirs))
}

/// nftables DNAT (`ip` or `ip6` family) spreading new flows at random.
fn nftables(topo: &Topology, family: Family) {
    let map: Vec<String> = family
        .backends(topo)
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{i} : {a}"))
        .collect();
    let (table, daddr) = family.nft();
    let gw_addr = family.gateway();
    topo.gateway.exec(&[
        "nft",
        &format!(
            "add table {table} berth_bench; \
             add chain {table} berth_bench pre {{ type nat hook prerouting priority dstnat; }}; \
             add rule {table} berth_bench pre {daddr} {gw_addr} udp dport {GW_PORT} \
             dnat to numgen random mod {BACKENDS} map {{ {} }} : {BACKEND_PORT}",
            map.join(", ")
        ),
    ]);
}

/// Backend `i`'s (1-based) address and port in `family`, `ip:port` (`[ip]:port`).
fn backend_at(topo: &Topology, family: Family, i: usize) -> String {
    SocketAddr::new(family.backends(topo)[i - 1], BACKEND_PORT).to_string()
}

/// The iptables DNAT rules of `mode` (with MASQUERADE toward the backends for
/// `IptablesMasq`); ip6tables in IPv6.
fn iptables(mode: Mode, topo: &Topology, family: Family) {
    let gw = &topo.gateway;
    let cmd = family.iptables(if mode == Mode::IptablesLegacy {
        "iptables-legacy"
    } else {
        "iptables-nft"
    });
    let cmd = cmd.as_str();
    // Rule i takes 1/(remaining) of the new flows: an even split.
    for i in 1..=BACKENDS {
        let (gw_addr, port) = (family.gateway().to_string(), GW_PORT.to_string());
        let to = backend_at(topo, family, i);
        let p = format!("{:.6}", 1.0 / (BACKENDS - i + 1) as f64);
        let mut rule = vec![
            cmd,
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            &gw_addr,
            "-p",
            "udp",
            "--dport",
            &port,
        ];
        if i < BACKENDS {
            rule.extend(["-m", "statistic", "--mode", "random", "--probability", &p]);
        }
        rule.extend(["-j", "DNAT", "--to-destination", &to]);
        gw.exec(&rule);
    }
    if mode == Mode::IptablesMasq {
        // Toward the backends (b1, b2, ...), the source becomes the address of
        // the interface the packet leaves by.
        gw.exec(&[
            cmd,
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            "b+",
            "-j",
            "MASQUERADE",
        ]);
    }
}
