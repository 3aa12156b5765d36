//! `berth drain` and `berth undrain`: hands the request to a running daemon and waits
//! until it applied it.
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::time::SystemTime;

use anyhow::{bail, Context as _};
use berth::{
    admin,
    announce::{control::Request, Status},
};

/// The daemon's `/api/v1/announce`.
pub(super) fn announce_status(addr: &str) -> anyhow::Result<Status> {
    let text = admin::get(addr, "/api/v1/announce")?;
    serde_json::from_str(&text).context("reading /api/v1/announce")
}

/// How long `berth drain` and `berth undrain` wait for the daemon to apply them.
const APPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `berth drain` / `berth undrain`: hands the request to the daemon, waits until its
/// loop applied it, and says what was withdrawn or announced, and where.
pub(crate) fn drain_cmd(addr: &str, request: Request) -> anyhow::Result<()> {
    let asking = || format!("asking the daemon at {addr}");
    let before = announce_status(addr).with_context(asking)?;
    let path = match request {
        Request::Drain => "/api/v1/drain",
        Request::Undrain => "/api/v1/undrain",
    };
    let answer: serde_json::Value =
        serde_json::from_str(&admin::post(addr, path).with_context(asking)?)
            .context("reading the daemon's answer")?;
    let number = answer["request"]
        .as_u64()
        .context("the daemon's answer has no request number")?;
    let deadline = std::time::Instant::now() + APPLY_TIMEOUT;
    let after = loop {
        let now = announce_status(addr).with_context(asking)?;
        if now.applied >= number {
            break now;
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the daemon at {addr} did not apply the request within {} s (see its log)",
                APPLY_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if let Some(e) = &after.persist_error {
        eprintln!("warning: the daemon could not record this in its state directory, so a restart forgets it: {e}");
    }
    println!(
        "{}",
        berth::output::drain_result(request, &before, &after, SystemTime::now())
    );
    Ok(())
}
