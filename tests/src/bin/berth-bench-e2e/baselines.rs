//! The gateway under test, set up per mode: Berth (`berth run` on a route to the
//! backends), Berth in SNAT mode (`berth-dp-loader` with the service source-NATed), the
//! netfilter DNAT baselines (iptables-legacy, iptables-nft, nftables), IPVS and iptables
//! DNAT + MASQUERADE.

use super::*;

pub(super) fn route_yaml(backends: &[Ipv4Addr]) -> String {
    let endpoints: String = backends
        .iter()
        .map(|a| format!("- addresses: [{a}]\n"))
        .collect();
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\nmetadata: {{name: bench, namespace: bench}}\n\
         spec:\n  parentRefs: [{{name: shared, namespace: infra, port: {GW_PORT}}}]\n  \
         rules: [{{backendRefs: [{{name: sink, port: 53}}]}}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: sink, namespace: bench}}\n\
         spec: {{ports: [{{name: udp, port: 53, protocol: UDP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: sink-1, namespace: bench, labels: {{kubernetes.io/service-name: sink}}}}\n\
         addressType: IPv4\nendpoints:\n{endpoints}ports: [{{name: udp, port: {BACKEND_PORT}, protocol: UDP}}]\n"
    )
}

/// The SNAT port range of the SNAT-mode row (the daemon's default, 32768-60999).
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 32768..=60999;

/// What keeps a mode's gateway running (Berth's daemon or loader), to drop (kill,
/// unpin) before the topology.
pub(super) type Running = Box<dyn std::any::Any>;

/// Sets the gateway up for `mode`.
pub(super) fn configure(mode: Mode, topo: &Topology) -> Option<Running> {
    let gw = &topo.gateway;
    let addr = |i: usize| topo.backend_addrs[i - 1];
    if matches!(mode, Mode::BerthSnat | Mode::IptablesMasq) {
        // Source NAT serves backends that do not route via the gateway: take their
        // default route away (they reach the gateway's address on their subnet).
        for b in &topo.backends {
            b.ip(&["route", "del", "default"]);
        }
    }
    match mode {
        Mode::Routing => {}
        Mode::Berth | Mode::BerthKernel => {
            let dirs = Dirs::with_example_files(&["gateway.yaml"]);
            std::fs::write(
                dirs.manifests.join("bench.yaml"),
                route_yaml(&topo.backend_addrs),
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
                        r.name == "bench" && r.port == Some(GW_PORT) && r.backends == BACKENDS
                    })
                },
            );
            return Some(Box::new((daemon, dirs)));
        }
        Mode::BerthSnat => {
            let service = ServiceAddr {
                addr: GW.into(),
                protocol: Protocol::Udp,
                port: GW_PORT,
            };
            let backends = (1..=BACKENDS)
                .map(|i| WeightedBackend {
                    endpoint: SocketAddrV4::new(addr(i), BACKEND_PORT).into(),
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
        Mode::IptablesLegacy | Mode::IptablesNft | Mode::IptablesMasq => iptables(mode, topo),
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
                    &backend_at(topo, i),
                    "-m",
                ]);
            }
        }
        Mode::Nftables => {
            let map: Vec<String> = (1..=BACKENDS)
                .map(|i| format!("{} : {}", i - 1, addr(i)))
                .collect();
            gw.exec(&[
                "nft",
                &format!(
                    "add table ip berth_bench; \
                     add chain ip berth_bench pre {{ type nat hook prerouting priority dstnat; }}; \
                     add rule ip berth_bench pre ip daddr {GW} udp dport {GW_PORT} \
                     dnat to numgen random mod {BACKENDS} map {{ {} }} : {BACKEND_PORT}",
                    map.join(", ")
                ),
            ]);
        }
    }
    None
}

/// Backend `i`'s (1-based) address and port, `ip:port`.
fn backend_at(topo: &Topology, i: usize) -> String {
    format!("{}:{BACKEND_PORT}", topo.backend_addrs[i - 1])
}

/// The iptables DNAT rules of `mode` (with MASQUERADE toward the backends for
/// `IptablesMasq`).
fn iptables(mode: Mode, topo: &Topology) {
    let gw = &topo.gateway;
    let cmd = if mode == Mode::IptablesLegacy {
        "iptables-legacy"
    } else {
        "iptables-nft"
    };
    // Rule i takes 1/(remaining) of the new flows: an even split.
    for i in 1..=BACKENDS {
        let (gw_addr, port, to) = (GW.to_string(), GW_PORT.to_string(), backend_at(topo, i));
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
