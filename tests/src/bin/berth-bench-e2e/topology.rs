//! The parts of the topology a measurement pins down: MACs, the gateway's threaded-NAPI
//! kernel thread on its own CPU.

use super::*;

/// An interface's MAC address.
pub(super) fn mac(ns: &Netns, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let text = v[0]["address"].as_str().unwrap_or_default();
    let mut mac = [0u8; 6];
    for (b, part) in mac.iter_mut().zip(text.split(':')) {
        *b = u8::from_str_radix(part, 16).unwrap_or_else(|_| panic!("MAC {text}"));
    }
    mac
}

pub(super) fn napi_threads() -> HashSet<(u32, String)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            comm.starts_with("napi/").then(|| (pid, comm.to_string()))
        })
        .collect()
}

/// Real-time priority of the NAPI threads: above every ordinary task, as softirq
/// processing (where NAPI runs when not threaded) is.
pub(super) const NAPI_PRIORITY: i32 = 50;

/// Turns on threaded NAPI for `iface` in `ns`, pins its thread to `cpu` and gives it
/// `NAPI_PRIORITY` (SCHED_FIFO); returns its PID.
pub(super) fn threaded_napi(ns: &Netns, iface: &str, cpu: usize) -> u32 {
    let before = napi_threads();
    ns.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{iface}/threaded"),
    ]);
    let prefix = format!("napi/{iface}-");
    let new: Vec<u32> = napi_threads()
        .difference(&before)
        .filter(|(_, comm)| comm.starts_with(&prefix))
        .map(|(pid, _)| *pid)
        .collect();
    assert!(
        new.len() == 1,
        "expected one new NAPI thread for {iface} in {}, found {new:?} (threaded NAPI needs a veth with GRO or XDP)",
        ns.name
    );
    pin(new[0], cpu);
    let param = libc::sched_param {
        sched_priority: NAPI_PRIORITY,
    };
    // SAFETY: plain syscall on a thread we just found; param outlives it.
    let rc = unsafe { libc::sched_setscheduler(new[0] as i32, libc::SCHED_FIFO, &param) };
    assert_eq!(
        rc,
        0,
        "SCHED_FIFO for {iface}'s NAPI thread: {}",
        std::io::Error::last_os_error()
    );
    new[0]
}
