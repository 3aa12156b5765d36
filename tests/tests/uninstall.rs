//! `berth uninstall` removes only what Berth made, says what it removed, and refuses
//! (removing nothing) while a daemon uses the pin directory or when the directory
//! holds anything that is not Berth's.

use std::{path::Path, process::Output};

use berth_tests::{
    daemon::{berth_binary, Daemon, Dirs},
    netns::{unique, Netns},
    topo::Topology,
};

/// `berth uninstall --pin-dir PINS` in `ns` (entering only its network namespace, so
/// the host's bpffs is the one seen), whatever its exit status.
fn uninstall(ns: &Netns, pins: &Path) -> Output {
    ns.command(&berth_binary())
        .arg("uninstall")
        .arg("--pin-dir")
        .arg(pins)
        .output()
        .expect("start berth uninstall")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether `iface` of `ns` runs an XDP program.
fn has_xdp(ns: &Netns, iface: &str) -> bool {
    let out = ns.ip(&["-d", "link", "show", "dev", iface]);
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

fn has_link(ns: &Netns, iface: &str) -> bool {
    ns.try_exec(&["ip", "link", "show", "dev", iface])
        .status
        .success()
}

/// A directory removed when the test ends (also when it fails).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn uninstall_on_a_copy_of_a_state_directory_refuses_and_leaves_it_and_berth0_intact() {
    let ns = Netns::new("unst");
    ns.ip(&["link", "add", "berth0", "type", "ifb"]);
    let copy = Scratch(std::env::temp_dir().join(format!("berth-{}", unique("stcopy"))));
    std::fs::create_dir_all(&copy.0).expect("dir");
    let files = [
        ("claims.log", "+\t{}\n"),
        ("first-seen.log", ""),
        ("owner", "1\n"),
    ];
    for (name, content) in files {
        std::fs::write(copy.0.join(name), content).expect("write");
    }
    let out = uninstall(&ns, &copy.0);
    let said = text(&out);
    assert!(!out.status.success(), "refused: {said}");
    assert!(said.contains("is not on a bpffs"), "{said}");
    assert!(said.contains("nothing removed"), "{said}");
    for (name, content) in files {
        assert_eq!(
            std::fs::read_to_string(copy.0.join(name)).ok().as_deref(),
            Some(content),
            "{name} intact"
        );
    }
    assert!(has_link(&ns, "berth0"), "berth0 left alone");

    // On bpffs, an entry Berth does not make is named, and nothing is removed.
    let pins = Scratch(format!("/sys/fs/bpf/berth-test-{}", unique("foreign")).into());
    std::fs::create_dir_all(pins.0.join("links")).expect("links");
    std::fs::create_dir_all(pins.0.join("someone-elses")).expect("foreign dir");
    let out = uninstall(&ns, &pins.0);
    let said = text(&out);
    assert!(!out.status.success(), "refused: {said}");
    assert!(
        said.contains(&format!(
            "{} is not Berth's",
            pins.0.join("someone-elses").display()
        )),
        "{said}"
    );
    assert!(pins.0.join("links").exists() && pins.0.join("someone-elses").exists());
    assert!(has_link(&ns, "berth0"), "berth0 left alone");

    // A pin directory that does not exist: nothing to remove, and an interface that
    // nothing marks as its own is not its.
    let out = uninstall(&ns, Path::new("/sys/fs/bpf/berth-test-absent"));
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("nothing of Berth's is pinned"), "{said}");
    assert!(said.contains("interface berth0 left alone"), "{said}");
    assert!(has_link(&ns, "berth0"), "berth0 left alone");
}

#[test]
fn uninstall_while_a_daemon_runs_refuses_and_the_daemon_stays_attached() {
    let topo = Topology::new(1);
    let dirs = Dirs::with_examples();
    let gw = &topo.gateway;
    let _daemon = Daemon::start(&topo, &dirs);
    let out = uninstall(gw, &dirs.pins);
    let said = text(&out);
    assert!(!out.status.success(), "refused: {said}");
    assert!(said.contains("in use by a running berth"), "{said}");
    for iface in &topo.gateway_ifaces {
        assert!(has_xdp(gw, iface), "{iface} still runs XDP");
    }
    assert!(dirs.pins.join("berth_ct").exists(), "maps still pinned");
    assert!(has_link(gw, "berth0"), "berth0 still there");
}

#[test]
fn a_normal_uninstall_lists_what_it_removed_and_leaves_no_trace() {
    let topo = Topology::new(1);
    let dirs = Dirs::with_examples();
    let gw = &topo.gateway;
    let mut daemon = Daemon::start(&topo, &dirs);
    daemon.kill9();
    let iface = &topo.gateway_ifaces[0];
    let ifindex = gw.ifindex(iface);
    assert!(
        has_xdp(gw, iface),
        "pinned links keep XDP after the daemon died"
    );
    let out = uninstall(gw, &dirs.pins);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let pins = dirs.pins.display();
    for line in [
        format!("removed link {pins}/links/xdp@{ifindex} (XDP program detached from {iface}"),
        format!("removed link {pins}/links/tc@{ifindex} (TC program detached from {iface}"),
        format!("removed map {pins}/berth_ct\n"),
        format!("removed map {pins}/berth_services\n"),
        format!("removed directory {pins}/links\n"),
        format!("removed directory {pins}\n"),
        "removed interface berth0".to_string(),
    ] {
        assert!(said.contains(&line), "{line:?} in:\n{said}");
    }
    for iface in &topo.gateway_ifaces {
        assert!(!has_xdp(gw, iface), "XDP left on {iface}");
    }
    assert!(!dirs.pins.exists(), "pin directory left");
    assert!(!has_link(gw, "berth0"), "berth0 left");
}

#[test]
fn uninstall_of_another_pin_directory_leaves_a_running_daemons_berth0() {
    // Namespace X runs a daemon on its pin directory; namespace Y's daemon was killed,
    // its pins stay. Uninstalling Y's pin directory from X (a wrong --pin-dir there)
    // removes Y's pins and leaves X's berth0.
    let x = Topology::new(1);
    let x_dirs = Dirs::with_examples();
    let _running = Daemon::start(&x, &x_dirs);
    let y = Topology::new(1);
    let y_dirs = Dirs::with_examples();
    let mut stopped = Daemon::start(&y, &y_dirs);
    stopped.kill9();
    let out = uninstall(&x.gateway, &y_dirs.pins);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("interface berth0 left alone: it is marked"),
        "{said}"
    );
    assert!(has_link(&x.gateway, "berth0"), "X's berth0 kept");
    assert!(!y_dirs.pins.exists(), "Y's pins removed");
    for iface in &x.gateway_ifaces {
        assert!(has_xdp(&x.gateway, iface), "X's {iface} still runs XDP");
    }
}
