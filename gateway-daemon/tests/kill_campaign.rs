//! The kill -9 campaign, with a full disk: a real `berth run` whose state directory is
//! a small tmpfs, under a random history of routes added and removed, the disk filled
//! (leaving nothing or a few KiB) and freed, and `kill -9` at random moments.
//!
//! Checked throughout: a route keeps the port it was seen with (0 ports moved); a claim
//! the state API showed is in the journal when the daemon is killed (0 claims lost); no
//! port has two holders (0 held twice); a daemon that could not write says so on
//! `/readyz` (503, naming the full disk); after each restart, with the disk freed and
//! the daemon settled, `berth state check` finds every record valid and no temporary
//! file of a killed daemon is left.
//!
//! `BERTH_CAMPAIGN_ROUNDS` (default 30) rounds; `BERTH_CAMPAIGN_SEED` replays a run
//! (the seed is printed). Needs root (mounts a tmpfs; unmounted when the test ends,
//! also on failure).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use berth::store::Store;

mod run;
use run::{fill, wait_for, Daemon, TempDir, Tmpfs};

/// splitmix64: enough randomness to pick moments, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max + 1))
    }
}

/// One shared Gateway with a TCP and a UDP range; released ports cool down briefly,
/// so that claims are also deleted during the campaign.
const GATEWAY: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: berth
spec:
  controllerName: berth.dev/gateway-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: shared
  namespace: infra
spec:
  gatewayClassName: berth
  addresses:
  - type: IPAddress
    value: 10.251.0.100
  infrastructure:
    parametersRef:
      group: berth.dev
      kind: GatewayConfig
      name: shared-l4
  listeners:
  - name: tcp-pool
    protocol: TCP
    port: 30000
    allowedRoutes:
      namespaces:
        from: All
  - name: udp-pool
    protocol: UDP
    port: 30000
    allowedRoutes:
      namespaces:
        from: All
---
apiVersion: berth.dev/v1alpha1
kind: GatewayConfig
metadata:
  name: shared-l4
  namespace: infra
spec:
  listeners:
  - name: tcp-pool
    endPort: 30999
  - name: udp-pool
    endPort: 30999
  releaseCooldown: 2s
";

/// A route of the campaign: never reused once removed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Route {
    kind: &'static str,
    namespace: String,
    name: String,
    /// A port asked for (from a part of the range no dynamic route reaches here).
    requested: Option<u16>,
}

impl Route {
    fn yaml(&self) -> String {
        let listener = if self.kind == "TCPRoute" {
            "tcp-pool"
        } else {
            "udp-pool"
        };
        let port = self
            .requested
            .map(|p| format!("\n    port: {p}"))
            .unwrap_or_default();
        format!(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: {}\nmetadata:\n  name: {}\n  \
             namespace: {}\nspec:\n  parentRefs:\n  - name: shared\n    namespace: infra\n    \
             sectionName: {listener}{port}\n  rules:\n  - backendRefs:\n    - name: svc\n      \
             port: 80\n",
            self.kind, self.name, self.namespace
        )
    }

    /// (kind, namespace, name), as the state API and the claims name the route.
    fn key(&self) -> (String, String, String) {
        (
            self.kind.to_string(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }
}

type RouteKey = (String, String, String);

/// Writes a file so that the daemon never reads half of it.
fn write_whole(path: &Path, text: &str) {
    let tmp = path.with_extension("part");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, path).expect("rename manifest");
}

/// The claims the state API shows: (route, protocol, port). None if it did not answer.
fn api_claims(d: &Daemon) -> Option<Vec<(RouteKey, String, u16)>> {
    let text = berth::admin::get(&d.admin, "/api/v1/state").ok()?;
    let state: serde_json::Value = serde_json::from_str(&text).ok()?;
    let claims = state["claims"].as_array()?;
    Some(
        claims
            .iter()
            .map(|c| {
                let r = &c["route"];
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                (
                    (s(&r["kind"]), s(&r["namespace"]), s(&r["name"])),
                    s(&c["protocol"]),
                    c["port"].as_u64().unwrap_or_default() as u16,
                )
            })
            .collect(),
    )
}

/// What the campaign found.
#[derive(Debug, Default)]
struct Tally {
    rounds: u64,
    kills: u64,
    fills: u64,
    /// Times the daemon was seen not ready because the disk was full.
    refused: u64,
    added: u64,
    removed: u64,
    /// Claims checked against the journal after a kill.
    checked: u64,
    moved: Vec<String>,
    lost: Vec<String>,
    twice: Vec<String>,
}

struct Campaign {
    rng: Rng,
    fs: Tmpfs,
    manifests: TempDir,
    state: PathBuf,
    present: BTreeMap<RouteKey, Route>,
    /// Route files, and the routes in each.
    files: BTreeMap<String, Vec<RouteKey>>,
    /// The port each present route was seen with.
    seen: BTreeMap<RouteKey, u16>,
    next_route: u32,
    next_requested: u16,
    full: Option<PathBuf>,
    tally: Tally,
}

impl Campaign {
    fn change_routes(&mut self) {
        // Now and then a burst: one file of many routes, taken in one cycle, whose
        // claims are one append that a nearly full disk cuts short.
        if self.present.len() < 60 && self.rng.chance(35) {
            let routes: Vec<Route> = (0..10 + self.rng.below(31))
                .map(|_| self.new_route())
                .collect();
            self.add_file(routes);
            return;
        }
        for _ in 0..1 + self.rng.below(3) {
            if self.present.len() < 4 || (self.present.len() < 60 && self.rng.chance(60)) {
                let route = self.new_route();
                self.add_file(vec![route]);
            } else {
                // A whole file goes: its routes release their claims.
                let i = self.rng.below(self.files.len() as u64) as usize;
                let file = self.files.keys().nth(i).expect("a file").clone();
                for key in self.files.remove(&file).expect("listed") {
                    self.present.remove(&key);
                    self.seen.remove(&key);
                    self.tally.removed += 1;
                }
                std::fs::remove_file(self.manifests.join(&file)).expect("remove routes");
            }
        }
    }

    fn new_route(&mut self) -> Route {
        let n = self.next_route;
        self.next_route += 1;
        let requested = self.rng.chance(20).then(|| {
            self.next_requested += 1;
            30500 + self.next_requested % 500
        });
        let kind = if self.rng.chance(70) {
            "TCPRoute"
        } else {
            "UDPRoute"
        };
        Route {
            kind,
            namespace: format!("team-{}", n % 3),
            name: format!("r{n}"),
            requested,
        }
    }

    fn add_file(&mut self, routes: Vec<Route>) {
        let file = format!("routes-{}.yaml", routes[0].name);
        let text: Vec<String> = routes.iter().map(Route::yaml).collect();
        write_whole(&self.manifests.join(&file), &text.join("---\n"));
        self.tally.added += routes.len() as u64;
        let keys = routes.iter().map(Route::key).collect();
        self.files.insert(file, keys);
        for r in routes {
            self.present.insert(r.key(), r);
        }
    }

    fn fill_or_free(&mut self) {
        match self.rng.below(3) {
            0 => {
                // Nothing, or a page or two (mostly one): room for some writes and not
                // others.
                let leave = [0, 4096, 4096, 8192][self.rng.below(4) as usize];
                self.full = Some(fill(&self.fs.0, leave));
                self.tally.fills += 1;
            }
            1 => self.free(),
            _ => {}
        }
    }

    fn free(&mut self) {
        if let Some(filler) = self.full.take() {
            std::fs::remove_file(filler).expect("free the disk");
        }
    }

    /// Reads the state API and checks what it shows: a present route keeps the port it
    /// was seen with, no port has two holders. Whether every present route has a port.
    fn observe(&mut self, d: &Daemon) -> Option<bool> {
        let claims = api_claims(d)?;
        let mut holders: BTreeMap<(String, u16), &RouteKey> = BTreeMap::new();
        for (route, protocol, port) in &claims {
            if let Some(other) = holders.insert((protocol.clone(), *port), route) {
                self.tally
                    .twice
                    .push(format!("{protocol} {port}: {other:?} and {route:?} (API)"));
            }
            if !self.present.contains_key(route) {
                continue;
            }
            match self.seen.insert(route.clone(), *port) {
                Some(was) if was != *port => {
                    self.tally.moved.push(format!("{route:?}: {was} -> {port}"))
                }
                _ => {}
            }
        }
        let with_port: BTreeSet<&RouteKey> = claims.iter().map(|(r, _, _)| r).collect();
        Some(self.present.keys().all(|r| with_port.contains(r)))
    }

    /// Observes the state API for `how_long` (at least once).
    fn observe_for(&mut self, d: &Daemon, how_long: Duration) {
        let until = std::time::Instant::now() + how_long;
        loop {
            self.observe(d);
            if std::time::Instant::now() >= until {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every present route has a port, or the daemon says the disk is
    /// full: what it could not write, it must not claim to be ready with.
    fn settled_or_refused(&mut self, d: &Daemon) {
        wait_for(
            "every route served, or not ready naming the full disk",
            || {
                if self.observe(d) == Some(true) {
                    return true;
                }
                let refused = d
                    .readyz()
                    .is_some_and(|(ok, body)| !ok && body.contains("No space left on device"));
                self.tally.refused += u64::from(refused);
                refused
            },
        );
    }

    /// After a kill: every claim of a present route the API showed is in the journal,
    /// and the journal holds no port twice.
    fn check_journal(&mut self) {
        let claims = Store::open(&self.state)
            .and_then(|s| s.claims())
            .expect("the killed daemon's journal reads");
        let mut holders: BTreeMap<(String, String, u16), String> = BTreeMap::new();
        for c in &claims {
            let key = (
                c.spec.gateway.to_string(),
                c.spec.protocol.to_string(),
                c.spec.port,
            );
            if let Some(other) = holders.insert(key, c.metadata.name.to_string()) {
                self.tally.twice.push(format!(
                    "{} {}: claims {other} and {} (journal)",
                    c.spec.protocol, c.spec.port, c.metadata.name
                ));
            }
        }
        for (route, port) in &self.seen {
            self.tally.checked += 1;
            let held = claims.iter().any(|c| {
                let r = &c.spec.route;
                (r.kind.as_str(), r.namespace.as_str(), r.name.as_str())
                    == (route.0.as_str(), route.1.as_str(), route.2.as_str())
                    && c.spec.port == *port
            });
            if !held {
                self.tally
                    .lost
                    .push(format!("{route:?} port {port} not in the journal"));
            }
        }
    }

    /// Temporary files in the state directory not written by `live`.
    fn stray_temporaries(&self, live: u32) -> Vec<String> {
        std::fs::read_dir(&self.state)
            .expect("state dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-") && !n.starts_with(&format!(".tmp-{live}-")))
            .collect()
    }

    fn state_check(&self) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["state", "check", "--state-dir"])
            .arg(&self.state)
            .output()
            .expect("berth state check");
        assert!(
            out.status.success(),
            "berth state check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn round(&mut self, mut d: Daemon) -> Daemon {
        // The disk fills before the daemon sees the change, or while it takes it.
        if self.rng.chance(50) {
            self.fill_or_free();
            self.change_routes();
        } else {
            self.change_routes();
            self.fill_or_free();
        }
        // Killed at a random moment after the change, or once the daemon has taken it
        // (served it, or said it could not).
        // (What it shows meanwhile is observed: a claim it shows must be durable.)
        if self.rng.chance(50) {
            let watch = self.rng.millis(300);
            self.observe_for(&d, watch);
        } else {
            self.settled_or_refused(&d);
            let watch = self.rng.millis(1000);
            self.observe_for(&d, watch);
        }
        // Sometimes also killed again while it starts on the full disk.
        loop {
            drop(d);
            self.tally.kills += 1;
            self.check_journal();
            d = Daemon::spawn(&self.manifests, &self.state, false);
            if !self.rng.chance(25) {
                break;
            }
            std::thread::sleep(self.rng.millis(100));
        }
        if self.full.is_some() {
            self.settled_or_refused(&d);
        }
        self.free();
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let ready = d.readyz();
            if ready.as_ref().is_some_and(|(ok, _)| *ok) && self.observe(&d) == Some(true) {
                break;
            }
            if std::time::Instant::now() > deadline {
                let served: BTreeSet<RouteKey> = api_claims(&d)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(r, _, _)| r)
                    .collect();
                let missing: Vec<&Route> = self
                    .present
                    .iter()
                    .filter(|(k, _)| !served.contains(*k))
                    .map(|(_, r)| r)
                    .collect();
                panic!(
                    "round {}: not settled after the disk was freed: /readyz {ready:?}; \
                     routes without a port: {missing:?}; state: {:?}",
                    self.tally.rounds,
                    berth::admin::get(&d.admin, "/api/v1/state")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.state_check();
        let pid = d.child.id();
        let stray = self.stray_temporaries(pid);
        assert!(
            stray.is_empty(),
            "temporary files of killed daemons: {stray:?}"
        );
        self.tally.rounds += 1;
        d
    }
}

#[test]
fn kill_9_with_a_full_disk_at_random_moments_loses_moves_and_doubles_nothing() {
    let rounds: u64 = std::env::var("BERTH_CAMPAIGN_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("BERTH_CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("time")
                .as_nanos() as u64
        });
    eprintln!("kill campaign: {rounds} rounds, BERTH_CAMPAIGN_SEED={seed}");
    let fs = Tmpfs::new("campaign", 256);
    // The manifests live elsewhere: only the state directory's disk fills up.
    let manifests = TempDir::new("campaign-manifests");
    write_whole(&manifests.join("gateway.yaml"), GATEWAY);
    let mut c = Campaign {
        rng: Rng(seed),
        state: fs.0.join("state"),
        fs,
        manifests,
        present: BTreeMap::new(),
        files: BTreeMap::new(),
        seen: BTreeMap::new(),
        next_route: 0,
        next_requested: 0,
        full: None,
        tally: Tally::default(),
    };
    let mut d = Daemon::start(&c.manifests, &c.state);
    for _ in 0..rounds {
        d = c.round(d);
        let t = &c.tally;
        assert!(
            t.moved.is_empty() && t.lost.is_empty() && t.twice.is_empty(),
            "seed {seed}, round {}: {t:#?}",
            t.rounds
        );
    }
    let t = &c.tally;
    eprintln!(
        "kill campaign, seed {seed}: {} rounds, {} kills, {} fills, not ready for a full \
         disk seen {} times, {} routes added, {} removed, {} claims checked in the journal \
         after a kill: {} ports moved, {} claims lost, {} held twice",
        t.rounds,
        t.kills,
        t.fills,
        t.refused,
        t.added,
        t.removed,
        t.checked,
        t.moved.len(),
        t.lost.len(),
        t.twice.len()
    );
    assert_eq!(t.rounds, rounds);
}
