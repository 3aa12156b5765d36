//! A minimal datapath loader for tests: loads (or adopts) the datapath, attaches it,
//! applies a desired state from a JSON file, reports, and stays until killed. It uses
//! exactly the API the daemon uses, so killing and restarting it shows what a daemon
//! restart does to traffic.
//!
//! `berth-dp-loader [--netns NAME] --pin-dir DIR --state FILE [--interface IF]...
//!  [--mode auto|native|skb] [--follow-xmit] [--default-limits] [--max-services N]
//!  [--max-backends N]`
//!
//! `--follow-xmit` keeps the map of interfaces that take XDP frames current, as
//! `berth run` does by default (without it the map stays empty: every packet takes the
//! kernel's path). `--default-limits` sizes the maps as `berth run` does by default
//! (262,144 conntrack entries, ...) instead of the tests' small limits; `--max-services`
//! and `--max-backends` (after it) change those two (to measure the maps' memory).

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use berth::datapath::{AttachMode, Attached, Config, Datapath, DesiredState};

fn main() -> anyhow::Result<()> {
    let mut pin_dir = None;
    let mut state = None;
    let mut ifaces = Vec::new();
    let mut mode = AttachMode::Auto;
    let mut follow_xmit = false;
    let mut limits = berth_tests::xdp::test_limits();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--netns" => enter_netns(&value()?)?,
            "--pin-dir" => pin_dir = Some(PathBuf::from(value()?)),
            "--state" => state = Some(PathBuf::from(value()?)),
            "--interface" => ifaces.push(value()?),
            "--mode" => {
                mode = match value()?.as_str() {
                    "auto" => AttachMode::Auto,
                    "native" => AttachMode::Native,
                    "skb" => AttachMode::Skb,
                    other => bail!("--mode {other}: expected auto, native or skb"),
                }
            }
            "--follow-xmit" => follow_xmit = true,
            "--default-limits" => limits = berth::datapath::Limits::default(),
            "--max-services" => limits.services = value()?.parse()?,
            "--max-backends" => limits.backends = value()?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    let pin_dir = pin_dir.context("--pin-dir is required")?;
    let state = state.context("--state is required")?;
    let desired: DesiredState = serde_json::from_slice(
        &std::fs::read(&state).with_context(|| format!("reading {}", state.display()))?,
    )
    .with_context(|| format!("parsing {}", state.display()))?;

    let config = Config { pin_dir, limits };
    let mut dp = Datapath::load(&config).context("loading the datapath")?;
    let adopted = dp.installed().services.len();
    if follow_xmit {
        berth::datapath::follow_xmit(&config.pin_dir)
            .context("following which interfaces take XDP frames")?;
    }
    let mut attached = Vec::new();
    for iface in &ifaces {
        let how = match dp
            .attach(iface, mode)
            .with_context(|| format!("attaching to {iface}"))?
        {
            Attached::Replaced(_) => "replaced".to_string(),
            Attached::New(m) => format!("new {m:?}"),
        };
        attached.push(format!("\"{iface}\":\"{how}\""));
    }
    if !berth::datapath::ipv4_forwarding_enabled().unwrap_or(false) {
        eprintln!(
            "warning: IPv4 forwarding is off (net.ipv4.ip_forward=0): packets the XDP program \
             hands to the kernel (neighbour not yet resolved, TTL 1) will be dropped"
        );
    }
    let report = dp.apply(&desired).context("applying the state")?;
    println!(
        "{{\"adopted\":{adopted},\"attached\":{{{}}},\"added\":{},\"changed\":{},\"removed\":{},\"unchanged\":{}}}",
        attached.join(","),
        report.added,
        report.changed,
        report.removed,
        report.unchanged
    );
    println!("ready");
    loop {
        std::thread::park();
    }
}

/// Joins the named network namespace (this thread, and threads started later).
fn enter_netns(name: &str) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: a valid namespace descriptor; affects only this (so far only) thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("setns {path}"));
    }
    Ok(())
}
