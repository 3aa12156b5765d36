//! `berth uninstall`: removes Berth from this host (its pinned programs, maps and
//! links, its reserved ports and its address interface).
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

use std::path::Path;

use anyhow::Context as _;
use berth::{datapath, netlink::DummyDeleted};

/// `berth uninstall`: removes what Berth pinned in the pin directory (its links first,
/// which detaches their programs, then its maps and directories) and the address
/// interface, printing each. Refuses, removing nothing, while a daemon uses the pin
/// directory or if anything in it is not Berth's.
pub(crate) fn uninstall(pin_dir: &Path, address_interface: &str) -> anyhow::Result<()> {
    let Some(pinned) = datapath::PinnedDatapath::survey(pin_dir)
        .with_context(|| format!("refusing to uninstall from {}", pin_dir.display()))?
    else {
        println!("nothing of Berth's is pinned in {}", pin_dir.display());
        // Only an interface marked for this pin directory is removed: an unmarked one
        // may be the address interface of a daemon with another --pin-dir.
        return remove_address_interface(pin_dir, address_interface, false);
    };
    let ports = datapath::pinned_service_ports(pinned.dir())
        .with_context(|| format!("reading the services pinned in {}", pin_dir.display()))?;
    berth::host::update_reserved_ports(&ports.iter().copied().collect(), &Default::default())
        .context("releasing the reserved ports (net.ipv4.ip_local_reserved_ports)")?;
    if !ports.is_empty() {
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        println!("released reserved ports {}", list.join(","));
    }
    let removed = pinned
        .remove()
        .with_context(|| format!("removing what Berth pinned in {}", pin_dir.display()))?;
    for r in &removed {
        println!("removed {r}");
    }
    remove_address_interface(pin_dir, address_interface, true)
}

/// Removes the address interface if it is marked as `pin_dir`'s (or, if
/// `unmarked_too`, not marked at all: made by an earlier version), saying what it did.
fn remove_address_interface(
    pin_dir: &Path,
    address_interface: &str,
    unmarked_too: bool,
) -> anyhow::Result<()> {
    let mark = datapath::address_interface_mark(pin_dir);
    match berth::netlink::delete_dummy(address_interface, &mark, unmarked_too) {
        Ok(DummyDeleted::Deleted) => println!("removed interface {address_interface}"),
        Ok(DummyDeleted::Absent) => println!("no interface {address_interface}"),
        Ok(DummyDeleted::Kept { alias }) if alias.is_empty() => println!(
            "interface {address_interface} left alone: nothing marks it as the address \
             interface of {}",
            pin_dir.display()
        ),
        Ok(DummyDeleted::Kept { alias }) => println!(
            "interface {address_interface} left alone: it is marked {alias:?}, the address \
             interface of another pin directory"
        ),
        Err(e) => return Err(e).with_context(|| format!("removing interface {address_interface}")),
    }
    Ok(())
}
