//! `cargo xtask bench health`: the CPU the daemon's health checker spends checking
//! 10,000 endpoints every 5 s with TCP checks (issue 30's budget: under 5 % of one
//! core). The checker runs in a network namespace of the bench's own, the endpoints are
//! 10,000 addresses (10.200.x.y, routed to the other namespace's loopback) of one
//! listener in a second one, across a veth pair as the kernel makes it; a thread there
//! accepts and closes their connections. As on a gateway, the checker's side runs on
//! one CPU and the backends' on the other: the bench pins itself to CPU 0 and the
//! listener thread to CPU 1, and steers each veth end's receive processing to its
//! side's CPU (RPS). Measured over 20 s after a 6 s warm-up: CPU 0's busy time (user,
//! system, irq and softirq from /proc/stat: the checker and the gateway's kernel work
//! for its checks), the checker thread's own CPU time (utime + stime of the thread
//! named `health`), and the checks made. With `--loopback`, the endpoints are
//! 127.1.x.y in the checker's own namespace on one CPU (the listener's half of every
//! handshake then runs in the checker's context too).
//! `--endpoints N`, `--interval 5s`. Prints a table and, last, one JSON line.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener},
    sync::Arc,
    time::{Duration, Instant},
};

use berth::health::{
    checks::{Check, CheckKind, Owner, Target, Wanted},
    Health,
};
use berth_tests::netns::Netns;

/// The allocator `berth` uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let endpoints: usize = arg("--endpoints").map_or(10_000, |n| n.parse().expect("--endpoints N"));
    let interval = arg("--interval").map_or(Duration::from_secs(5), |d| {
        humantime::parse_duration(&d).expect("--interval DURATION")
    });
    let loopback = args.iter().any(|a| a == "--loopback");
    let checker = Netns::new("hc");
    checker.ip(&["link", "set", "lo", "up"]);
    let report = if loopback {
        checker.enter(|| measure(endpoints, interval, Ipv4Addr::new(127, 1, 0, 0), None))
    } else {
        let backends = Netns::new("hb");
        backends.ip(&["link", "set", "lo", "up"]);
        berth_tests::topo::veth(
            &checker,
            "hc0",
            &["10.199.0.1/24"],
            &backends,
            "hb0",
            &["10.199.0.2/24"],
            berth_tests::topo::Veth::HOST_B,
        );
        // Every 10.200.x.y is the backends' own (the listener takes them all).
        backends.ip(&["route", "add", "local", "10.200.0.0/16", "dev", "lo"]);
        checker.ip(&["route", "add", "10.200.0.0/16", "via", "10.199.0.2"]);
        // Each side's receive processing on its own CPU.
        checker.exec(&[
            "sh",
            "-c",
            "echo 1 > /sys/class/net/hc0/queues/rx-0/rps_cpus",
        ]);
        backends.exec(&[
            "sh",
            "-c",
            "echo 2 > /sys/class/net/hb0/queues/rx-0/rps_cpus",
        ]);
        pin_to(0);
        let listener = backends.enter(|| TcpListener::bind("0.0.0.0:0").expect("listen"));
        let port = listener.local_addr().expect("port").port();
        std::thread::spawn(move || {
            pin_to(1);
            for c in listener.incoming() {
                drop(c);
            }
        });
        let at = Ipv4Addr::new(10, 200, 0, 0);
        checker.enter(|| measure(endpoints, interval, at, Some(port)))
    };
    println!("{report}");
}

/// Checks `endpoints` addresses from `base` (its last two bytes counting up) every
/// `interval`, at `port` (`None`: a listener of this namespace).
fn measure(endpoints: usize, interval: Duration, base: Ipv4Addr, port: Option<u16>) -> String {
    let port = port.unwrap_or_else(|| {
        let listener = TcpListener::bind("0.0.0.0:0").expect("listen");
        let port = listener.local_addr().expect("port").port();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                drop(c);
            }
        });
        port
    });
    let check = Arc::new(Check {
        kind: CheckKind::Tcp,
        port: None,
        interval,
        timeout: Duration::from_secs(1),
        healthy_threshold: 2,
        unhealthy_threshold: 3,
    });
    let owner = Arc::new(Owner {
        namespace: "bench".into(),
        policy: "health".into(),
        service: "many".into(),
    });
    let targets = (0..endpoints)
        .map(|i| {
            let [a, b, _, _] = base.octets();
            let ip = Ipv4Addr::new(a, b, (i >> 8) as u8, (i & 0xff) as u8);
            Target {
                owner: Arc::clone(&owner),
                endpoint: SocketAddr::new(IpAddr::V4(ip), port),
                check: Arc::clone(&check),
            }
        })
        .collect();
    let health = Health::start(|| {}).expect("checker");
    health.set(Wanted {
        targets,
        problems: Vec::new(),
    });
    std::thread::sleep(Duration::from_secs(6));
    let (cpu0, busy0, checks0, at0) = (checker_cpu(), cpu0_busy(), health.counts(), Instant::now());
    std::thread::sleep(Duration::from_secs(20));
    let (cpu1, busy1, checks1, at1) = (checker_cpu(), cpu0_busy(), health.counts(), Instant::now());
    let wall = (at1 - at0).as_secs_f64();
    let busy = 100.0 * (busy1 - busy0).as_secs_f64() / wall;
    let cpu = (cpu1 - cpu0).as_secs_f64();
    let checks = checks1.checks - checks0.checks;
    let failed = checks1.failed - checks0.failed;
    let share = 100.0 * cpu / wall;
    let per_check_us = 1e6 * cpu / checks.max(1) as f64;
    println!(
        "health checks: {endpoints} endpoints from {base}, TCP, every {}",
        humantime::format_duration(interval)
    );
    println!(
        "checks per second                  {:>10.0}",
        checks as f64 / wall
    );
    println!("failed                             {failed:>10}");
    println!("CPU 0 busy (checker side), %       {busy:>10.2}");
    println!("checker thread CPU, % of one core  {share:>10.2}");
    println!("checker CPU per check, µs          {per_check_us:>10.1}");
    format!(
        "[{{\"endpoints\":{endpoints},\"interval_s\":{},\"checks_per_s\":{:.0},\"failed\":{failed},\"cpu0_busy_percent\":{busy:.2},\"cpu_percent\":{share:.2},\"cpu_per_check_us\":{per_check_us:.1}}}]",
        interval.as_secs_f64(),
        checks as f64 / wall
    )
}

/// Pins the calling thread to CPU `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// CPU 0's busy time so far: user, nice, system, irq and softirq (/proc/stat).
fn cpu0_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let line = stat.lines().find(|l| l.starts_with("cpu0 ")).expect("cpu0");
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq
    let ticks = f[0] + f[1] + f[2] + f[5] + f[6];
    Duration::from_secs_f64(ticks / 100.0)
}

/// CPU time (user and system) of this process's thread named `health`.
fn checker_cpu() -> Duration {
    let tick = 100.0; // USER_HZ on Linux
    for task in std::fs::read_dir("/proc/self/task")
        .expect("tasks")
        .flatten()
    {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if name.trim() != "health" {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).expect("stat");
        // Fields after the command (which may hold spaces) in parentheses.
        let rest = &stat[stat.rfind(')').expect("stat") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command.
        let ticks: f64 =
            f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
        return Duration::from_secs_f64(ticks / tick);
    }
    panic!("no health checker thread")
}
