//! SNAT mode's maps: each backend's source address (the node's address on the route
//! toward it, what `MASQUERADE` would pick) and the pool of source ports the kernel
//! program claims from for each new flow.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    ops::RangeInclusive,
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData};
use gateway_common::{map_names, proto, Flow, FlowKey, NAT_DST, NAT_SRC, SNAT_PORT_SLOTS};

use super::{
    family::{Addr6, ByFamily, MapAddr},
    map_err, Conntrack, Datapath, LinkRole, Result,
};

/// How often the daemon asks again for the node's address toward every SNAT backend
/// (routes and addresses may have changed): a connect per backend, no packet sent.
pub const SNAT_SOURCE_REFRESH: Duration = Duration::from_secs(5);

/// A UDP SNAT flow idle both ways this long gives its node port back (netfilter's UDP
/// timeout). The kernel's LRU frees an entry only when the table is full, so without
/// this a backend's ports ran out for good after as many flows as ports (measured: every
/// new SNAT flow dropped after ~56k flows under a DNS-style load).
pub const SNAT_IDLE_UDP: Duration = Duration::from_secs(30);
/// The same for TCP: 10 minutes (Berth does not follow TCP's state).
pub const SNAT_IDLE_TCP: Duration = Duration::from_secs(600);

/// The SNAT entries one scan of a family's conntrack saw, for `expire_idle`.
pub(super) struct SnatFlows<A: MapAddr> {
    /// Forward entries → when they last forwarded a packet.
    forward_seen: HashMap<FlowKey<A>, u32>,
    /// Reply entries (they hold the node ports).
    replies: Vec<(FlowKey<A>, Flow<A>)>,
}

impl<A: MapAddr> Default for SnatFlows<A> {
    fn default() -> Self {
        SnatFlows {
            forward_seen: HashMap::new(),
            replies: Vec::new(),
        }
    }
}

impl<A: MapAddr> SnatFlows<A> {
    /// Notes entry `f` under `k` if it is a SNAT flow's forward or reply entry.
    pub(super) fn see(&mut self, k: &FlowKey<A>, f: &Flow<A>) {
        if f.is_snat() && f.kind == NAT_DST {
            self.forward_seen.insert(*k, f.seen);
        } else if f.is_snat() && f.kind == NAT_SRC {
            self.replies.push((*k, *f));
        }
    }
}

/// Finds the node's address toward a backend (of the backend's family).
pub type SourceResolver = Box<dyn Fn(IpAddr) -> Option<IpAddr> + Send + Sync>;

/// The SNAT maps and what this process wrote into them.
pub(super) struct Snat {
    sources: ByFamily<Array<MapData, u32>, Array<MapData, Addr6>>,
    ports: Array<MapData, u32>,
    /// Backend id → source address written (`None`: none known, zero in the map).
    written: HashMap<u32, Option<IpAddr>>,
    /// The port ranges the port map holds, once this process wrote them.
    ports_written: Option<Vec<RangeInclusive<u16>>>,
    resolve: SourceResolver,
    /// When `keep_snat_sources_current` last asked for every source.
    refreshed_at: Option<Instant>,
    /// The SNAT backends without a node address last logged.
    unresolved: BTreeSet<SocketAddr>,
    /// SNAT backends the kernel's routes reach out of an interface that refused this
    /// datapath's programs (no TC program there to give the node's source): backend →
    /// the interface's name. Checked only once some interface is attached.
    pub(super) egress_without_tc: BTreeMap<SocketAddr, String>,
    /// Interfaces SNAT traffic leaves out of that refused the programs → why.
    refused: BTreeMap<u32, String>,
    /// Conntrack entries this process deleted (idle SNAT flows).
    pub(super) deleted: u64,
}

impl Snat {
    pub(super) fn new(
        sources: ByFamily<Array<MapData, u32>, Array<MapData, Addr6>>,
        ports: Array<MapData, u32>,
    ) -> Self {
        Snat {
            sources,
            ports,
            written: HashMap::new(),
            ports_written: None,
            resolve: Box::new(node_source),
            refreshed_at: None,
            unresolved: BTreeSet::new(),
            egress_without_tc: Default::default(),
            refused: BTreeMap::new(),
            deleted: 0,
        }
    }

    pub(super) fn ports_written(&self) -> Vec<RangeInclusive<u16>> {
        self.ports_written.clone().unwrap_or_default()
    }
}

/// The address the kernel gives a connection to `backend` as its source: the preferred
/// source of the route toward it, else the outgoing interface's primary address (for
/// IPv6, the kernel's source address selection). Asked by connecting a UDP socket,
/// which sends nothing.
pub fn node_source(backend: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = match backend {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0)).ok()?;
    socket.connect((backend, 9)).ok()?;
    let local = socket.local_addr().ok()?.ip();
    (!local.is_unspecified()).then_some(local)
}

impl Datapath {
    /// Replaces how the node's address toward a backend is found (tests use a fixed
    /// answer; the default asks the kernel's routes).
    pub fn set_source_resolver(&mut self, resolve: SourceResolver) {
        self.snat.resolve = resolve;
        self.snat.written.clear();
    }

    /// Writes backend `bid`'s SNAT source if it differs from what was written. A
    /// backend with no route gets 0: its new flows are dropped and counted
    /// (`drop_snat_no_source`) until a route appears and `refresh_snat_sources` runs.
    pub(super) fn write_snat_source(&mut self, bid: u32, endpoint: SocketAddr) -> Result<bool> {
        let want = (self.snat.resolve)(endpoint.ip());
        self.set_snat_source(bid, endpoint.ip(), want)
    }

    /// Writes `want` as the source toward backend `bid` at `backend` (an address of
    /// another family than the backend's counts as none).
    fn set_snat_source(&mut self, bid: u32, backend: IpAddr, want: Option<IpAddr>) -> Result<bool> {
        let want = want.filter(|a| a.is_ipv4() == backend.is_ipv4());
        if self.snat.written.get(&bid) == Some(&want) {
            return Ok(false);
        }
        let sources = &mut self.snat.sources;
        match backend {
            IpAddr::V4(_) => sources
                .v4
                .set(bid, want.and_then(u32::of).unwrap_or(0), 0)
                .map_err(map_err(map_names::SNAT_SOURCES))?,
            IpAddr::V6(_) => sources
                .v6
                .set(bid, want.and_then(Addr6::of).unwrap_or_default(), 0)
                .map_err(map_err(map_names::SNAT_SOURCES6))?,
        }
        self.snat.written.insert(bid, want);
        Ok(true)
    }

    /// Asks again for the source of every backend of a SNAT service (after routes or
    /// addresses changed) and writes those that changed; returns how many did. Each
    /// backend address is asked once, however many services and ports it serves.
    pub fn refresh_snat_sources(&mut self) -> Result<usize> {
        let backends: Vec<(u32, SocketAddr)> = self
            .installed
            .values()
            .filter(|svc| svc.snat)
            .flat_map(|svc| svc.backends.iter().map(|(&e, &(bid, _))| (bid, e)))
            .collect();
        let mut asked: HashMap<IpAddr, Option<IpAddr>> = HashMap::new();
        let mut changed = 0;
        for (bid, endpoint) in backends {
            let ip = endpoint.ip();
            let want = *asked.entry(ip).or_insert_with(|| (self.snat.resolve)(ip));
            changed += usize::from(self.set_snat_source(bid, ip, want)?);
        }
        Ok(changed)
    }

    /// Conntrack entries this process deleted (idle SNAT flows), for the eviction
    /// estimate.
    pub fn conntrack_deleted(&self) -> u64 {
        self.snat.deleted
    }

    /// Between plans and after each: when `SNAT_SOURCE_REFRESH` has passed, asks again
    /// for every SNAT backend's source (a route or address may have changed) and logs
    /// the SNAT backends without a node address, once each time that set changes (their
    /// new flows are dropped and counted `drop_snat_no_source`).
    pub fn keep_snat_sources_current(&mut self) {
        if self
            .snat
            .refreshed_at
            .is_some_and(|t| t.elapsed() < SNAT_SOURCE_REFRESH)
        {
            return;
        }
        self.snat.refreshed_at = Some(Instant::now());
        match self.refresh_snat_sources() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                backends = n,
                "the node's address toward SNAT backends changed"
            ),
            Err(e) => tracing::warn!(error = %e, "refreshing the SNAT source addresses"),
        }
        let unresolved: BTreeSet<SocketAddr> = self
            .installed
            .values()
            .filter(|svc| svc.snat)
            .flat_map(|svc| svc.backends.iter())
            .filter(|(_, (bid, _))| self.snat.written.get(bid) == Some(&None))
            .map(|(&endpoint, _)| endpoint)
            .collect();
        self.check_snat_egress();
        if unresolved != self.snat.unresolved {
            if unresolved.is_empty() {
                tracing::info!("every SNAT backend has a node address toward it again");
            } else {
                let list: Vec<String> = unresolved.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    backends = list.join(" "),
                    "no route to these SNAT backends: the node has no address toward them, so \
                     their new flows are dropped (counted drop_snat_no_source)"
                );
            }
            self.snat.unresolved = unresolved;
        }
    }

    /// Gives Berth's programs to every interface that is no `--interface` but where SNAT
    /// traffic to a backend leaves (`links.rs`: a tunnel, a pod's veth), takes them off
    /// those where none leaves any more, and logs each change. Without them the kernel
    /// would forward such packets as XDP left them, with the client's source, and the
    /// backend's replies to the node's address would find no socket. A backend whose
    /// interface refuses the programs stays in `Snat::egress_without_tc` (said in its
    /// route's row); the attach is not tried again while its interface stays the same.
    fn check_snat_egress(&mut self) {
        let attached = super::links::attached(&self.pin_dir);
        if !attached.values().any(|r| *r == LinkRole::Listed) {
            return;
        }
        let endpoints: BTreeSet<SocketAddr> = self
            .installed
            .values()
            .filter(|svc| svc.snat)
            .flat_map(|svc| svc.backends.keys().copied())
            .collect();
        // Every lookup answered: only then is an interface known to carry no SNAT traffic.
        let mut complete = true;
        let mut asked: HashMap<IpAddr, Option<u32>> = HashMap::new();
        let mut egress: BTreeMap<u32, Vec<SocketAddr>> = BTreeMap::new();
        for endpoint in endpoints {
            let oif = *asked.entry(endpoint.ip()).or_insert_with(|| {
                crate::netlink::route_oif(endpoint.ip()).unwrap_or_else(|_| {
                    complete = false;
                    None
                })
            });
            if let Some(oif) = oif.filter(|i| attached.get(i) != Some(&LinkRole::Listed)) {
                egress.entry(oif).or_default().push(endpoint);
            }
        }
        let name = |oif: u32| crate::sys::iface::index_to_name(oif).unwrap_or(oif.to_string());
        // A backend on this host: delivered, not forwarded.
        egress.retain(|&oif, _| name(oif) != "lo");
        self.snat.refused.retain(|oif, _| egress.contains_key(oif));
        let mut without = BTreeMap::new();
        for (&oif, backends) in &egress {
            let iface = name(oif);
            let list = || {
                backends
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            if !self.snat.refused.contains_key(&oif) && !self.holds_snat_egress(oif) {
                let fresh = attached.get(&oif) != Some(&LinkRole::SnatEgress);
                match self.attach_snat_egress(&iface, oif) {
                    Ok(how) if fresh => tracing::info!(
                        iface,
                        mode = ?how,
                        backends = list(),
                        "SNAT traffic to these backends leaves out of an interface that is no \
                         --interface: attached Berth's programs there (TC gives the packets the \
                         node's source, XDP takes the replies back)"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(
                            iface,
                            backends = list(),
                            error = %crate::error_chain(&e),
                            "SNAT traffic to these backends leaves out of an interface that is \
                             no --interface, and Berth's programs could not be attached there: \
                             packets the kernel forwards there keep the client's source (unless \
                             the backend routes replies through this gateway, its flows break)"
                        );
                        self.snat.refused.insert(oif, crate::error_chain(&e));
                    }
                }
            }
            if self.snat.refused.contains_key(&oif) {
                without.extend(backends.iter().map(|&b| (b, iface.clone())));
            }
        }
        if complete {
            let unused = attached
                .iter()
                .filter(|&(oif, role)| *role == LinkRole::SnatEgress && !egress.contains_key(oif));
            for (&oif, _) in unused {
                self.detach_snat_egress(oif);
                tracing::info!(
                    iface = name(oif),
                    "no SNAT traffic leaves out of this interface any more: detached Berth's \
                     programs"
                );
            }
        }
        self.snat.egress_without_tc = without;
    }

    /// SNAT backends whose traffic leaves out of an interface without this datapath's
    /// programs: backend → the interface's name.
    pub fn snat_egress_without_tc(&self) -> &BTreeMap<SocketAddr, String> {
        &self.snat.egress_without_tc
    }

    /// Makes the port map hold `want` (ascending ranges). Growing, the ports go in
    /// before the count that exposes them; shrinking, the count goes first.
    /// Returns whether the map changed.
    pub(super) fn sync_snat_ports(&mut self, want: &[RangeInclusive<u16>]) -> Result<bool> {
        if self.snat.ports_written.as_deref() == Some(want) {
            return Ok(false);
        }
        let ports: Vec<u16> = want
            .iter()
            .flat_map(|r| r.clone())
            .take(SNAT_PORT_SLOTS as usize - 1)
            .collect();
        let count = ports.len() as u32;
        let old_count = self.snat.ports.get(&0, 0).unwrap_or(0);
        let set_count = |snat: &mut Snat| {
            snat.ports
                .set(0, count, 0)
                .map_err(map_err(map_names::SNAT_PORTS))
        };
        if count < old_count {
            set_count(&mut self.snat)?;
        }
        for (i, port) in ports.iter().enumerate() {
            self.snat
                .ports
                .set(i as u32 + 1, u32::from(port.to_be()), 0)
                .map_err(map_err(map_names::SNAT_PORTS))?;
        }
        if count >= old_count {
            set_count(&mut self.snat)?;
        }
        self.snat.ports_written = Some(want.to_vec());
        Ok(true)
    }
}

/// Deletes from `conntrack` the entries of the SNAT flows `seen` (by the conntrack
/// scan) idle both ways for their service's timeout in `idle_of` (clock units), else
/// `SNAT_IDLE_UDP` / `SNAT_IDLE_TCP` (forward packets by
/// `Flow::seen`, replies by the reply entry's next-hop time), so their node ports are
/// free again; returns how many flows, and how many entries were deleted. The flow's
/// next packet, if one comes, is a new flow with a port of its own.
pub(super) fn expire_idle<A: MapAddr>(
    conntrack: &mut Conntrack<A>,
    seen: SnatFlows<A>,
    idle_of: &HashMap<gateway_common::ServiceId, u32>,
) -> (usize, u64) {
    let units = |d: Duration| u32::try_from(d.as_nanos() >> 20).unwrap_or(u32::MAX);
    let now = (crate::sys::clock::monotonic_coarse_ns() >> 20) as u32;
    let (mut expired, mut deleted) = (0, 0);
    for (reply_key, r) in seen.replies {
        // The route's own timeout (a RouteTrafficPolicy), else the protocol's default.
        let idle = idle_of.get(&r.service).copied().unwrap_or_else(|| {
            units(if reply_key.proto == proto::UDP {
                SNAT_IDLE_UDP
            } else {
                SNAT_IDLE_TCP
            })
        });
        let quiet = |t: u32| t == 0 || now.wrapping_sub(t) > idle;
        let key = |src: (A, u16), dst: (A, u16)| FlowKey {
            src: src.0,
            dst: dst.0,
            sport: src.1,
            dport: dst.1,
            proto: reply_key.proto,
            pad: [0; 3],
        };
        let (client, gateway) = ((r.peer_addr, r.peer_port), (r.nat_addr, r.nat_port));
        let backend = (reply_key.src, reply_key.sport);
        let forward = key(client, gateway);
        if !quiet(r.next_hop.checked_at)
            || seen
                .forward_seen
                .get(&forward)
                .is_some_and(|&seen| !quiet(seen))
        {
            continue;
        }
        // The reply entry holds the port: it goes first. Then the forward entry and
        // the kernel-path entries (client → backend, backend → client), if any.
        for k in [
            reply_key,
            forward,
            key(client, backend),
            key(backend, client),
        ] {
            if conntrack.remove(&k).is_ok() {
                deleted += 1;
            }
        }
        expired += 1;
    }
    (expired, deleted)
}
