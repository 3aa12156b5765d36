//! A test or benchmark stopped by a signal (Ctrl-C, a CI timeout's SIGTERM) removes what
//! it set up, as its guards would have on drop: its namespaces and what runs in them,
//! the processes it started, its pins and directories. Needs root.

use std::{
    io::{BufRead, BufReader},
    os::unix::process::ExitStatusExt,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use berth_tests::{
    daemon::Dirs,
    loader::Pins,
    netns::{wait_until, Netns, Proc},
};

/// Set in the environment of the child process that `child_sets_up_and_waits` runs in.
const CHILD: &str = "BERTH_CLEANUP_CHILD";

/// Run by the test below in a process of its own (it returns at once otherwise): sets
/// up a namespace with a process in it, a process outside, pins and directories, says
/// what they are on one line, and waits to be stopped.
#[test]
#[ignore = "the child process of a_signal_removes_what_a_test_set_up; it runs it"]
fn child_sets_up_and_waits() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let ns = Netns::new("sig");
    let inside = ns.spawn(&["sleep", "600"]);
    let outside = Proc::from_child(
        Command::new("sleep").arg("600").spawn().expect("sleep"),
        "sleep",
    );
    let dirs = Dirs::with_examples();
    let pins = Pins::new();
    std::fs::create_dir_all(&pins.dir).expect("pin dir");
    println!(
        "ready {} {} {} {} {}",
        ns.name,
        inside.pid(),
        outside.pid(),
        dirs.manifests.display(),
        pins.dir.display()
    );
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn has_netns(name: &str) -> bool {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

/// Whether `pid` is a process that has not yet exited (a zombie has).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// What the child said it set up, removed here if the test fails before its signal
/// has: namespace, processes (by PID, the child's own), manifests, pins.
struct Leftovers(Vec<String>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        let [ns, inside, outside, manifests, pins] = &self.0[..] else {
            return;
        };
        for pid in [inside, outside] {
            if alive(pid) {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        if has_netns(ns) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(manifests);
        let _ = berth::datapath::remove_pins(Path::new(pins));
    }
}

#[test]
fn a_signal_removes_what_a_test_set_up() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut child = Command::new(std::env::current_exe().expect("this test's binary"))
            .args([
                "--exact",
                "child_sets_up_and_waits",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let ready = loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read the child");
            assert!(n > 0, "the child ended before it was ready");
            if let Some(rest) = line.strip_prefix("ready ") {
                break rest
                    .split_whitespace()
                    .map(String::from)
                    .collect::<Vec<_>>();
            }
        };
        let _leftovers = Leftovers(ready.clone());
        let [ns, inside, outside, manifests, pins] = &ready[..] else {
            panic!("the child said {line:?}");
        };
        assert!(has_netns(ns), "{ns} was set up");
        assert!(alive(inside) && alive(outside), "both processes run");
        assert!(Path::new(manifests).is_dir() && Path::new(pins).is_dir());

        // SAFETY: a signal to the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
        let mut status = None;
        wait_until("the child to end", Duration::from_secs(20), || {
            status = child.try_wait().expect("wait");
            status.is_some()
        });
        let status = status.expect("ended");
        assert_eq!(status.signal(), Some(sig), "ended by the signal: {status}");
        assert!(!has_netns(ns), "signal {sig}: namespace {ns} is left");
        wait_until("the processes to end", Duration::from_secs(10), || {
            !alive(inside) && !alive(outside)
        });
        assert!(
            !Path::new(manifests).exists(),
            "signal {sig}: {manifests} is left"
        );
        assert!(!Path::new(pins).exists(), "signal {sig}: {pins} is left");
    }
}
