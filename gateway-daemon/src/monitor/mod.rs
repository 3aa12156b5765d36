//! `berth monitor`: the datapath's events, live (`gateway-ebpf/src/monitor.rs`).
//!
//! The command reads the pinned ring buffer (`berth_events`) of the datapath in its pin
//! directory and says it listens by writing its process id and wishes into the pinned
//! `berth_config` (`config::MONITOR*`): which reasons (in the kernel, so that the
//! rate limit spends nothing on others), one in how many, at most how many a second
//! per CPU. It turns the events off when it ends (Ctrl-C, `--count`, `--duration`);
//! if it is killed, the daemon turns them off within its next scan
//! (`Datapath::forget_gone_monitor`). Addresses, ports and routes are filtered here.
//! One monitor at a time listens to one datapath.

pub mod event;
pub mod pcap;

use std::{
    collections::HashMap,
    io::Write,
    net::{IpAddr, SocketAddr},
    os::fd::AsFd,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use gateway_common::{config, map_names, Counter, MONITOR_BYTES};

pub use event::{Event, Headers};

/// What `berth monitor` shows, and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The datapath's pin directory.
    pub pin_dir: PathBuf,
    /// The daemon's admin endpoint (for `routes`).
    pub admin_addr: String,
    /// Only these reasons (none: every event).
    pub reasons: Vec<Counter>,
    /// Only packets of these routes (`namespace/name`).
    pub routes: Vec<String>,
    /// Only packets from or to these addresses.
    pub addresses: Vec<IpAddr>,
    /// Only packets from or to these ports.
    pub ports: Vec<u16>,
    /// One event in this many, per CPU.
    pub sample: u32,
    /// At most this many events a second per CPU.
    pub rate: u32,
    /// One JSON object a line instead of text.
    pub json: bool,
    /// Also write the packets to this pcap file (`-`: standard output, and no lines).
    pub pcap: Option<PathBuf>,
    /// End after this many events shown.
    pub count: Option<u64>,
    /// End after this long.
    pub duration: Option<Duration>,
}

/// The counter named `name` if it is an event, for the command line.
pub fn reason(name: &str) -> Result<Counter, String> {
    let events = || {
        Counter::ALL
            .iter()
            .filter(|c| c.is_event())
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match Counter::ALL.iter().find(|c| c.name() == name) {
        Some(c) if c.is_event() => Ok(*c),
        Some(_) => Err(format!(
            "{name} counts the ordinary course of a flow, not an event; events: {}",
            events()
        )),
        None => Err(format!("no reason {name}; events: {}", events())),
    }
}

/// Which packets are shown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// From or to one of these addresses (none: any).
    pub addresses: Vec<IpAddr>,
    /// From or to one of these ports (none: any).
    pub ports: Vec<u16>,
    /// Of one of these routes (none: any).
    pub routes: Vec<RouteMatch>,
}

/// A route's packets: of its protocol, to or from one of its gateway endpoints
/// (address and port) or backends. Another gateway address serving the same port is
/// another route's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// `namespace/name`.
    pub route: String,
    /// Its IP protocol.
    pub proto: u8,
    /// Its gateway addresses with its assigned ports.
    pub gateway: Vec<SocketAddr>,
    /// Its backends, with their ports.
    pub backends: Vec<SocketAddr>,
}

impl Filter {
    /// Whether a packet whose heads (as it entered, as it left) say `heads` is shown.
    pub fn matches(&self, heads: &[Headers]) -> bool {
        let any = |f: &dyn Fn(&Headers) -> bool| heads.iter().any(f);
        (self.addresses.is_empty() || any(&|h| self.addresses.iter().any(|a| h.has_address(*a))))
            && (self.ports.is_empty() || any(&|h| self.ports.iter().any(|p| h.has_port(*p))))
            && (self.routes.is_empty()
                || self.routes.iter().any(|r| {
                    any(&|h| {
                        let at = |e: &SocketAddr| h.has_endpoint(e.ip(), e.port());
                        h.proto == r.proto
                            && (r.gateway.iter().any(at) || r.backends.iter().any(at))
                    })
                }))
    }
}

/// What the daemon at `admin` says of `routes` (`namespace/name`): their ports and
/// endpoints. An unknown route, or one that holds no port, is an error.
fn resolve_routes(admin: &str, routes: &[String]) -> anyhow::Result<Vec<RouteMatch>> {
    if routes.is_empty() {
        return Ok(Vec::new());
    }
    let ask = |path| {
        crate::admin::get(admin, path)
            .with_context(|| format!("asking the daemon at {admin} for {path} (for --route)"))
    };
    let rows: Vec<crate::admin::RouteRow> = serde_json::from_str(&ask("/api/v1/routes")?)?;
    let backends: crate::admin::backends::BackendsView =
        serde_json::from_str(&ask("/api/v1/backends")?)?;
    routes
        .iter()
        .map(|spec| {
            let Some((namespace, name)) = spec.split_once('/') else {
                bail!("--route {spec}: give the route as NAMESPACE/NAME");
            };
            let mine: Vec<_> = rows
                .iter()
                .filter(|r| r.namespace == namespace && r.name == name)
                .collect();
            let Some(first) = mine.first() else {
                bail!("--route {spec}: the daemon at {admin} has no such route");
            };
            let Some(kind) = crate::model::RouteKind::of_name(&first.kind) else {
                bail!(
                    "--route {spec}: the daemon at {admin} gives it kind {:?}",
                    first.kind
                );
            };
            let proto = kind.protocol().number();
            let backends = backends
                .backends
                .iter()
                .filter(|b| {
                    b.namespace == namespace
                        && b.route.split_once('/').is_some_and(|(_, n)| n == name)
                })
                .filter_map(|b| b.endpoint.parse().ok())
                .collect();
            let route = RouteMatch {
                route: spec.clone(),
                proto,
                gateway: mine
                    .iter()
                    .flat_map(|r| {
                        let port = r.port;
                        r.addresses
                            .iter()
                            .filter_map(move |a| Some(SocketAddr::new(*a, port?)))
                    })
                    .collect(),
                backends,
            };
            if route.gateway.is_empty() {
                bail!(
                    "--route {spec}: the route is served on no gateway address and port \
                     (`berth get routes` says why)"
                );
            }
            Ok(route)
        })
        .collect()
}

/// The monitor's hold on a datapath: its wishes in `berth_config`, taken back when
/// dropped.
pub struct Listening {
    config: Array<MapData, u32>,
    pid: u32,
}

impl Listening {
    /// Says this process listens, wanting `reasons` (none: all), one in `sample`, at
    /// most `rate` a second per CPU. Refused while another live monitor listens.
    pub fn start(
        pin_dir: &Path,
        reasons: &[Counter],
        sample: u32,
        rate: u32,
    ) -> anyhow::Result<Self> {
        let path = pin_dir.join(map_names::CONFIG);
        let data = MapData::from_pin(&path).with_context(|| {
            format!(
                "no Berth datapath is pinned in {} (is `berth run` running? give its --pin-dir)",
                pin_dir.display()
            )
        })?;
        let mut config: Array<MapData, u32> = Array::try_from(Map::Array(data))?;
        let pid = std::process::id();
        let holder = config.get(&config::MONITOR, 0)?;
        let alive = config.get(&config::MONITOR_ALIVE, 0)?;
        if holder != 0 && holder != pid && !stale(alive) {
            bail!(
                "berth monitor (process {holder}) already listens to the datapath in {}",
                pin_dir.display()
            );
        }
        let mask = if reasons.is_empty() {
            Counter::ALL
                .iter()
                .filter(|c| c.is_event())
                .fold(0u64, |m, c| m | 1 << *c as u32)
        } else {
            reasons.iter().fold(0u64, |m, c| m | 1 << *c as u32)
        };
        config.set(config::MONITOR_REASONS_LO, mask as u32, 0)?;
        config.set(config::MONITOR_REASONS_HI, (mask >> 32) as u32, 0)?;
        config.set(config::MONITOR_SAMPLE, sample.max(1), 0)?;
        config.set(config::MONITOR_RATE, rate, 0)?;
        let previous = config.get(&config::MONITOR_SESSION, 0)?;
        config.set(config::MONITOR_SESSION, previous.wrapping_add(1), 0)?;
        config.set(config::MONITOR_ALIVE, now_secs(), 0)?;
        // Last: the program reads the wishes once this is set.
        config.set(config::MONITOR, pid, 0)?;
        Ok(Listening { config, pid })
    }

    /// Says the listener is still there (see `config::MONITOR_ALIVE`).
    pub fn still_here(&mut self) {
        let _ = self.config.set(config::MONITOR_ALIVE, now_secs(), 0);
    }
}

/// `CLOCK_MONOTONIC` in seconds, as `config::MONITOR_ALIVE` holds it.
pub fn now_secs() -> u32 {
    (crate::sys::clock::monotonic_ns() / 1_000_000_000) as u32
}

/// Whether a listener last there at `alive` (`config::MONITOR_ALIVE`) is gone.
pub fn stale(alive: u32) -> bool {
    now_secs().saturating_sub(alive) > config::MONITOR_STALE_SECS
}

impl Drop for Listening {
    fn drop(&mut self) {
        if self.config.get(&config::MONITOR, 0).ok() == Some(self.pid) {
            let _ = self.config.set(config::MONITOR, 0, 0);
        }
    }
}

/// The count of `monitor_lost` in the pin directory's counters, if readable.
fn lost(pin_dir: &Path) -> Option<u64> {
    let data = MapData::from_pin(pin_dir.join(map_names::COUNTERS)).ok()?;
    let counters: PerCpuArray<MapData, u64> = PerCpuArray::try_from(Map::PerCpuArray(data)).ok()?;
    let values = counters.get(&(Counter::MonitorLost as u32), 0).ok()?;
    Some(values.iter().sum())
}

/// The datapath's event ring buffer pinned in `pin_dir`.
pub fn events(pin_dir: &Path) -> anyhow::Result<RingBuf<MapData>> {
    let path = pin_dir.join(map_names::EVENTS);
    let data = MapData::from_pin(&path).with_context(|| {
        format!(
            "no event ring buffer is pinned at {} (a daemon of an older version, or no `berth run` with this --pin-dir)",
            path.display()
        )
    })?;
    Ok(RingBuf::try_from(Map::RingBuf(data))?)
}

/// Runs `berth monitor`: shows events until interrupted, `count` or `duration`.
pub fn run(options: &Options) -> anyhow::Result<()> {
    let filter = Filter {
        addresses: options.addresses.clone(),
        ports: options.ports.clone(),
        routes: resolve_routes(&options.admin_addr, &options.routes)?,
    };
    let mut ring = events(&options.pin_dir)?;
    let mut pcap = match &options.pcap {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some(pcap::Pcap::new(
            Box::new(std::io::stdout().lock()) as Box<dyn Write>,
            MONITOR_BYTES as u32,
        )?),
        Some(p) => {
            let file =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            Some(pcap::Pcap::new(
                Box::new(std::io::BufWriter::new(file)) as Box<dyn Write>,
                MONITOR_BYTES as u32,
            )?)
        }
    };
    let lines = options.pcap.as_deref() != Some(Path::new("-"));
    let lost_before = lost(&options.pin_dir);
    let interrupted = crate::sys::signal::catch_interrupts();
    let mut listening = Listening::start(
        &options.pin_dir,
        &options.reasons,
        options.sample,
        options.rate,
    )?;
    eprintln!(
        "berth monitor: listening to the datapath pinned in {} (Ctrl-C ends)",
        options.pin_dir.display()
    );
    // The events' clock (CLOCK_MONOTONIC) to the wall clock's.
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let offset = unix_now.saturating_sub(u128::from(crate::sys::clock::monotonic_ns()));
    let started = Instant::now();
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut shown = 0u64;
    let done = |shown: u64| {
        interrupted.load(std::sync::atomic::Ordering::Relaxed)
            || options.count.is_some_and(|n| shown >= n)
            || options.duration.is_some_and(|d| started.elapsed() >= d)
    };
    while !done(shown) {
        crate::sys::poll::poll([Some(ring.as_fd()), None], Duration::from_millis(200))?;
        listening.still_here();
        while let Some(item) = ring.next() {
            let Some(event) = Event::parse(&item) else {
                continue;
            };
            drop(item);
            let heads: Vec<Headers> = [&event.entered, &event.left]
                .into_iter()
                .filter_map(|h| Headers::parse(h))
                .collect();
            if !filter.matches(&heads) {
                continue;
            }
            shown += 1;
            let unix_ns = offset + u128::from(event.time_ns);
            if let Some(p) = pcap.as_mut() {
                p.frame(unix_ns, &event.entered, event.len)?;
                if event.left != event.entered {
                    p.frame(unix_ns, &event.left, event.len)?;
                }
                p.flush()?;
            }
            if lines {
                let iface = names.entry(event.ifindex).or_insert_with(|| {
                    crate::sys::iface::index_to_name(event.ifindex)
                        .unwrap_or_else(|| event.ifindex.to_string())
                });
                println!("{}", line(&event, unix_ns, iface, options.json));
            }
            if done(shown) {
                break;
            }
        }
    }
    drop(listening);
    let lost = lost(&options.pin_dir)
        .zip(lost_before)
        .map(|(a, b)| a.saturating_sub(b));
    eprintln!(
        "berth monitor: {shown} events shown; {} not sent (over the rate, or the buffer full: monitor_lost)",
        lost.map_or("?".into(), |n| n.to_string())
    );
    Ok(())
}

/// An event as a line of text or JSON.
fn line(event: &Event, unix_ns: u128, iface: &str, json: bool) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(unix_ns as u64);
    let (entered, left) = (Headers::parse(&event.entered), Headers::parse(&event.left));
    if json {
        return serde_json::json!({
            "time": humantime::format_rfc3339_micros(time).to_string(),
            "reason": event.reason.name(),
            "verdict": event.verdict(),
            "interface": iface,
            "hook": event.hook_name(),
            "cpu": event.cpu,
            "len": event.len,
            "entered": entered,
            "left": left,
        })
        .to_string();
    }
    let head = |h: Option<Headers>| h.map_or_else(|| "(not IP)".to_string(), |h| h.to_string());
    // The TC program's events say so: the interface is the one the packet leaves by.
    let at = if event.hook == gateway_common::HOOK_TC {
        format!("{iface} egress")
    } else {
        iface.to_string()
    };
    let mut s = format!(
        "{} cpu{} {} {} {} {}",
        humantime::format_rfc3339_micros(time),
        event.cpu,
        at,
        event.reason.name(),
        event.verdict().to_uppercase(),
        head(entered)
    );
    if left != entered {
        s.push_str(&format!(" => {}", head(left)));
    }
    s.push_str(&format!(" len {}", event.len));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(src: &str, dst: &str) -> Headers {
        let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        Headers {
            proto: gateway_common::proto::TCP,
            src: src.ip(),
            dst: dst.ip(),
            sport: Some(src.port()),
            dport: Some(dst.port()),
            tcp_flags: Some(0x02),
        }
    }

    #[test]
    fn a_route_filter_takes_its_gateway_endpoints_and_backends_not_its_port_elsewhere() {
        let filter = Filter {
            routes: vec![RouteMatch {
                route: "team-a/web".into(),
                proto: gateway_common::proto::TCP,
                gateway: vec!["10.0.0.100:30000".parse().unwrap()],
                backends: vec!["10.1.0.5:8080".parse().unwrap()],
            }],
            ..Filter::default()
        };
        let to_route = tcp("192.0.2.7:40000", "10.0.0.100:30000");
        let dnat = tcp("192.0.2.7:40000", "10.1.0.5:8080");
        assert!(filter.matches(&[to_route, dnat]));
        assert!(filter.matches(&[tcp("10.1.0.5:8080", "192.0.2.7:40000")]));
        // The same port on another gateway address is another route's; so is a
        // client's source port that happens to be the route's.
        assert!(!filter.matches(&[tcp("192.0.2.7:40000", "10.0.0.101:30000")]));
        assert!(!filter.matches(&[tcp("192.0.2.7:30000", "10.0.0.101:80")]));
        // Its endpoints over UDP are not its packets.
        let udp = Headers {
            proto: gateway_common::proto::UDP,
            ..to_route
        };
        assert!(!filter.matches(&[udp]));
    }
}
