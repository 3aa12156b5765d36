//! Sizing the conntrack and the flood guard's limit from `berth run`, with the real
//! kernel: a small table filled by real DNS flows through a namespace network, its
//! occupancy and evictions on `/metrics`, a restart that keeps it and one that asks for
//! another size. Needs root.

use std::{net::SocketAddrV4, time::Duration};

use aya::maps::{Array, MapData};
use berth_tests::{
    daemon::{metrics, sample, Daemon, Dirs},
    netns::poll,
    topo::{Flow, Topology, CLIENT, GW},
};
use gateway_common::{config, map_names, Flow as Entry, FlowKey};

/// Team B's DNS route (examples/team-b.yaml).
const DNS: SocketAddrV4 = SocketAddrV4::new(GW, 30053);
const SIZE: u64 = 1024;
/// Distinct client flows sent: three times what the table holds.
const FLOWS: u16 = 3 * SIZE as u16;
/// Far above what the test sends, so the flood guard never holds flows back here; and
/// neither 0 (an unwritten map) nor the default.
const FLOW_LIMIT: u32 = 1_000_000;

/// The `/metrics` samples this test reads, once the daemon has counted the table.
#[derive(Debug)]
struct Occupancy {
    entries: u64,
    capacity: u64,
    evictions: u64,
    created: u64,
    new_flows: u64,
}

fn occupancy(text: &str) -> Result<Occupancy, String> {
    let get = |series: &str| sample(text, series).ok_or(format!("no {series} in:\n{text}"));
    let counter = |reason: &str| {
        get(&format!(
            "berth_datapath_packets_total{{reason=\"{reason}\"}}"
        ))
    };
    // The flood guard's counter is published with the others.
    counter("flood_untracked")?;
    Ok(Occupancy {
        entries: get("berth_conntrack_entries")?,
        capacity: get("berth_conntrack_capacity")?,
        evictions: get("berth_conntrack_evictions_total")?,
        created: counter("ct_created")?,
        new_flows: counter("new_flow")?,
    })
}

/// Entries in the pinned conntrack, read from the kernel.
fn pinned_entries(dirs: &Dirs) -> u64 {
    let data = MapData::from_pin(dirs.pins.join(map_names::CONNTRACK)).expect("pinned conntrack");
    let ct: aya::maps::HashMap<MapData, FlowKey, Entry> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).expect("conntrack");
    ct.keys().filter(Result::is_ok).count() as u64
}

/// Polls `/metrics` until the daemon publishes `entries` conntrack entries (it counts
/// them every 10 s).
fn counted(topo: &Topology, entries: u64) -> Occupancy {
    poll(
        "the daemon to count the conntrack",
        Duration::from_secs(30),
        || {
            let o = occupancy(&metrics(&topo.gateway))?;
            if o.entries != entries {
                return Err(format!("counted {o:?}, the table holds {entries}"));
            }
            Ok(o)
        },
    )
}

#[test]
fn a_small_conntrack_fills_evicts_counts_it_and_survives_a_restart_of_the_same_size() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_example_files(&["gateway.yaml", "team-b.yaml"]);
    let size = SIZE.to_string();
    let limit = FLOW_LIMIT.to_string();
    let args = ["--conntrack-size", &size, "--new-flow-limit", &limit];
    let mut daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, &args);

    // The limit reached the kernel's config map.
    let config_map = dirs.pins.join(map_names::CONFIG);
    let data = MapData::from_pin(&config_map).expect("pinned config map");
    let slots: Array<MapData, u32> =
        Array::try_from(aya::maps::Map::Array(data)).expect("config is an array of u32");
    assert_eq!(slots.get(&config::NEW_FLOW_LIMIT, 0).ok(), Some(FLOW_LIMIT));

    // Three times as many distinct DNS flows as the table holds, each answered.
    let answered = topo.client.enter(|| {
        (0..FLOWS)
            .filter(|i| {
                let local = SocketAddrV4::new(CLIENT, 20000 + i);
                Flow::bound(local, DNS, Duration::from_secs(1))
                    .ask()
                    .is_some()
            })
            .count()
    });
    assert!(
        answered >= usize::from(FLOWS) * 9 / 10,
        "only {answered} of {FLOWS} DNS flows were answered"
    );

    let entries = pinned_entries(&dirs);
    assert!(
        (SIZE * 3 / 4..=SIZE).contains(&entries),
        "{FLOWS} flows fill the table of {SIZE}: it holds {entries}"
    );
    let before = counted(&topo, entries);
    eprintln!("after {FLOWS} flows ({answered} answered): {before:?}");
    assert_eq!(before.capacity, SIZE);
    assert!(before.entries <= SIZE, "{before:?}");
    assert!(
        before.new_flows > SIZE,
        "more flows were recorded than the table holds: {before:?}"
    );
    // The kernel counts the entries it creates, not those its LRU evicts: the estimate
    // is the difference, and here every flow beyond the table's size was evicted.
    assert!(before.created >= u64::from(FLOWS), "{before:?}");
    assert_eq!(
        before.evictions,
        before.created - before.entries,
        "{before:?}"
    );
    assert!(before.evictions >= u64::from(FLOWS) - SIZE, "{before:?}");

    // A restart with another size is refused, naming both sizes and the option, and
    // leaves the table as it was.
    daemon.kill9();
    let stderr = dirs.refused_start(&topo, &["--conntrack-size", "2048"]);
    for want in [
        "holds 1024 entries",
        "asked for 2048",
        "--conntrack-size 1024",
        "berth_ct",
    ] {
        assert!(stderr.contains(want), "no {want:?} in:\n{stderr}");
    }

    // The same size adopts the table with its flows.
    let _daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, &args);
    assert_eq!(
        pinned_entries(&dirs),
        entries,
        "no flow was lost or added over the restarts"
    );
    let after = counted(&topo, entries);
    assert_eq!(after.capacity, SIZE);
}
