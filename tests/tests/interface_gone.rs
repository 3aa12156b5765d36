//! An interface Berth is attached to that is deleted under it is logged (a warning
//! naming it, once), not lost silently.

use std::{
    process::{Child, Stdio},
    time::Duration,
};

use berth_tests::{
    daemon::Dirs,
    netns::{unique, wait_until},
    topo::Topology,
};

/// A `berth run` child, killed (by PID) on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A file removed on drop.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn an_attached_interface_that_is_deleted_is_logged_once_by_name() {
    let topo = Topology::new(2);
    let dirs = Dirs::with_examples();
    let gw = &topo.gateway;
    let log = Scratch(std::env::temp_dir().join(format!("berth-{}.log", unique("gone"))));
    let mut cmd = dirs.berth_run(gw);
    for iface in &topo.gateway_ifaces {
        cmd.args(["--interface", iface]);
    }
    let file = std::fs::File::create(&log.0).expect("log file");
    let _daemon = Running(
        cmd.stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start berth run"),
    );
    let text = || std::fs::read_to_string(&log.0).unwrap_or_default();
    wait_until("berth run to attach", Duration::from_secs(20), || {
        text().contains("berth running")
    });
    // Let the link follower see the attached interfaces once.
    std::thread::sleep(Duration::from_secs(1));
    let victim = topo.gateway_ifaces.last().expect("an interface").clone();
    gw.ip(&["link", "del", &victim]);
    let says = "an attached interface is gone (deleted)";
    wait_until("the deletion to be logged", Duration::from_secs(15), || {
        text()
            .lines()
            .any(|l| l.contains(says) && l.contains(&format!("iface=\"{victim}\"")))
    });
    std::thread::sleep(Duration::from_secs(1));
    let times = text().lines().filter(|l| l.contains(says)).count();
    assert_eq!(times, 1, "logged once:\n{}", text());
}
