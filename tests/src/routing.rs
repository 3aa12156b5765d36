//! The routing daemons operators run beside Berth, in a test namespace: BIRD 2
//! (Debian's `bird2`) and FRR (`frr`: zebra, bgpd, bfdd). Configs are written to a
//! directory of the test's; the daemons run in the foreground, killed by PID on drop.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::netns::{wait_until, Netns, Proc};

/// A config shipped in `deploy/` (`bird/bird.conf`, `frr/frr.conf`), with its example
/// values (router id, AS numbers, neighbour) replaced by `(from, to)` pairs.
pub fn shipped_config(file: &str, replace: &[(&str, &str)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let mut text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    for (from, to) in replace {
        assert!(
            text.contains(from),
            "{} has no {from:?} to replace",
            path.display()
        );
        text = text.replace(from, to);
    }
    text
}

/// A gateway's BGP speaker, either daemon.
pub enum Speaker {
    /// BIRD 2.
    Bird(Bird),
    /// FRR.
    Frr(Frr),
}

impl Speaker {
    /// Kills the daemon(s) (SIGKILL): the sessions drop as a crashed node's would.
    pub fn kill(&mut self) {
        match self {
            Speaker::Bird(b) => b.kill(),
            Speaker::Frr(f) => f.procs.clear(),
        }
    }
}

/// A running BIRD.
pub struct Bird {
    proc: Proc,
    ctl: PathBuf,
}

impl Bird {
    /// Writes `config` as `dir/NAME.conf` and starts BIRD with it in `ns`; waits until
    /// it answers on its control socket.
    pub fn start(ns: &Netns, dir: &Path, name: &str, config: &str) -> Self {
        let conf = dir.join(format!("{name}.conf"));
        let ctl = dir.join(format!("{name}.ctl"));
        std::fs::write(&conf, config).unwrap_or_else(|e| panic!("writing {conf:?}: {e}"));
        let child = ns
            .command(Path::new("bird"))
            .arg("-f")
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(&ctl)
            .arg("-P")
            .arg(dir.join(format!("{name}.pid")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting bird in {}: {e}", ns.name));
        let mut bird = Bird {
            proc: Proc::from_child(child, &format!("bird {name}")),
            ctl,
        };
        wait_until(
            &format!("bird {name} to answer"),
            Duration::from_secs(10),
            || {
                bird.proc.assert_running();
                bird.try_birdc(&["show", "status"]).is_some()
            },
        );
        bird
    }

    /// `birdc CMD...` on this BIRD's socket; its output if it answered.
    pub fn try_birdc(&self, cmd: &[&str]) -> Option<String> {
        let out = Command::new("birdc")
            .arg("-s")
            .arg(&self.ctl)
            .args(cmd)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Panics if BIRD exited.
    pub fn assert_running(&mut self) {
        self.proc.assert_running();
    }

    /// Kills BIRD (SIGKILL).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// A running FRR: zebra (which imports the kernel table), bgpd and bfdd, as Debian's
/// `frr` package runs them, with sockets and pid files in a directory of their own.
pub struct Frr {
    procs: Vec<Proc>,
}

impl Frr {
    /// Writes `config` into `dir/NAME/frr.conf` and starts the daemons with it in `ns`
    /// (zebra first: the others connect to it).
    pub fn start(ns: &Netns, dir: &Path, name: &str, config: &str) -> Self {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("creating {home:?}: {e}"));
        let conf = home.join("frr.conf");
        std::fs::write(&conf, config).unwrap_or_else(|e| panic!("writing {conf:?}: {e}"));
        // The daemons drop to user frr (keeping only network capabilities): their
        // directory must be frr's.
        crate::netns::run(&["chown", "-R", "frr:frr", &home.to_string_lossy()]);
        let zserv = home.join("zserv.api");
        let mut procs = Vec::new();
        for daemon in ["zebra", "bgpd", "bfdd"] {
            let child = ns
                .command(&Path::new("/usr/lib/frr").join(daemon))
                .arg("-f")
                .arg(&conf)
                .arg("-i")
                .arg(home.join(format!("{daemon}.pid")))
                .arg("-z")
                .arg(&zserv)
                .arg("--vty_socket")
                .arg(&home)
                .args(["-u", "frr", "-g", "frr", "--log", "stdout"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {daemon} in {}: {e}", ns.name));
            procs.push(Proc::from_child(child, &format!("{daemon} {name}")));
            if daemon == "zebra" {
                wait_until(
                    &format!("zebra {name} to listen"),
                    Duration::from_secs(10),
                    || zserv.exists(),
                );
            }
        }
        let mut frr = Frr { procs };
        for p in &mut frr.procs {
            p.assert_running();
        }
        frr
    }
}
