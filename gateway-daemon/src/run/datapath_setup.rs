//! How `berth run` sets up the datapath: loads or adopts the pinned maps and links,
//! writes the flow settings into the config map, follows which interfaces take XDP
//! frames, attaches to the interfaces, turns ICMP redirects off, and owns the address
//! interface and the announce table. Each stage says what it did in the log.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use berth::datapath::{self, AttachMode, Attached, Config, Datapath, LinkChange};

use crate::cli::{Redirect, ReplyOrigin, XdpMode};

/// How `berth run` sets up the datapath.
pub(super) struct DatapathOptions {
    pub(super) interfaces: Vec<String>,
    pub(super) xdp_mode: XdpMode,
    pub(super) redirect: Redirect,
    pub(super) pin_dir: PathBuf,
    /// Map sizes: `--max-services`, `--max-backends`, `--conntrack-size`.
    pub(super) limits: datapath::Limits,
    /// New flows per second per CPU the kernel records (0: no limit).
    pub(super) new_flow_limit: u32,
    /// `--reply-origin`.
    pub(super) reply_origin: ReplyOrigin,
    pub(super) address_interface: Option<String>,
    /// `--announce-table`.
    pub(super) announce_table: Option<u32>,
    /// Whether the addresses are published from the start (not while a drain kept
    /// from an earlier run holds).
    pub(super) announcing: bool,
}

/// Loads the datapath, attaches it to the interfaces (none: no datapath), follows
/// which interfaces take XDP frames, and owns the address interface if asked to.
pub(super) fn load_datapath(options: &DatapathOptions) -> anyhow::Result<Option<Datapath>> {
    // A first start that fails (an interface that does not exist, a hook held by
    // another program) leaves nothing pinned behind.
    let fresh = !options.interfaces.is_empty() && !options.pin_dir.exists();
    let loaded = set_up_datapath(options);
    if loaded.is_err() && fresh {
        let _ = datapath::remove_pins(&options.pin_dir);
    }
    loaded
}

fn set_up_datapath(options: &DatapathOptions) -> anyhow::Result<Option<Datapath>> {
    let DatapathOptions {
        interfaces,
        xdp_mode,
        redirect,
        pin_dir,
        limits,
        new_flow_limit,
        reply_origin,
        address_interface,
        announce_table,
        announcing,
    } = options;
    if interfaces.is_empty() {
        tracing::warn!("no --interface: planning and serving state only, no datapath");
        if announce_table.is_some() {
            tracing::warn!(
                "--announce-table without --interface: no address is served, so none is announced"
            );
        }
        return Ok(None);
    }
    let mut dp = load_sized(pin_dir, limits)?;
    set_new_flow_limit(&mut dp, *new_flow_limit, limits.flows)?;
    set_reply_origin(&mut dp, *reply_origin)?;
    attach(&mut dp, interfaces, *xdp_mode)?;
    // After the attach: the xmit map says which interfaces hold the hand-off program.
    set_redirect(pin_dir, *redirect)?;
    disable_icmp_redirects(interfaces);
    // Before anything is published: a drain kept from an earlier run holds.
    dp.set_announcing(*announcing)
        .context("deciding what to publish")?;
    publish_addresses(&mut dp, address_interface.as_deref(), *announce_table)?;
    if !datapath::ipv4_forwarding_enabled().unwrap_or(false) {
        tracing::error!(
            "IPv4 forwarding is off (net.ipv4.ip_forward=0): every packet the XDP program hands to the kernel (interfaces that take no XDP frames, unresolved neighbours) will be dropped; set net.ipv4.ip_forward=1"
        );
    }
    Ok(Some(dp))
}

/// Loads (or adopts) the datapath's maps and programs, sized by `limits`, and says how
/// large it is.
fn load_sized(pin_dir: &Path, limits: &datapath::Limits) -> anyhow::Result<Datapath> {
    let conntrack_size = limits.flows;
    let dp = Datapath::load(&Config {
        pin_dir: pin_dir.to_path_buf(),
        limits: *limits,
    })
    .context("loading the datapath")?;
    // The kernel's own accounting of the maps (best effort: only reported).
    let kernel_memory_mib = berth::datapath::pinned_memory(pin_dir)
        .map(|maps| maps.values().sum::<u64>() / (1 << 20))
        .unwrap_or_default();
    tracing::info!(
        max_services = limits.services,
        max_backends = limits.backends,
        conntrack_size,
        kernel_memory_mib,
        "datapath sized: routes beyond it wait for room, oldest served first"
    );
    Ok(dp)
}

/// Writes `--new-flow-limit` into the datapath's config map.
fn set_new_flow_limit(
    dp: &mut Datapath,
    new_flow_limit: u32,
    conntrack_size: u32,
) -> anyhow::Result<()> {
    dp.set_new_flow_limit(new_flow_limit)
        .context("writing --new-flow-limit into the datapath's config map")?;
    match new_flow_limit {
        0 => tracing::info!(
            conntrack_size,
            "no new-flow limit: every new flow is recorded in the conntrack"
        ),
        limit => tracing::info!(
            conntrack_size,
            new_flow_limit = limit,
            "new flows beyond the limit (per second per CPU) are balanced by Maglev alone"
        ),
    }
    Ok(())
}

/// Writes `--reply-origin` into the datapath's config map.
fn set_reply_origin(dp: &mut Datapath, reply_origin: ReplyOrigin) -> anyhow::Result<()> {
    let any_origin = reply_origin == ReplyOrigin::Any;
    dp.set_reply_origin_any(any_origin)
        .context("writing --reply-origin into the datapath's config map")?;
    if any_origin {
        tracing::warn!(
            "--reply-origin any: replies are translated from whatever interface and \
             neighbour they come from; a host that forges a backend's address can answer \
             for it"
        );
    }
    Ok(())
}

/// `--redirect auto`: follows which interfaces take XDP frames; `never`: clears the
/// xmit map, so that the kernel forwards every packet.
fn set_redirect(pin_dir: &Path, redirect: Redirect) -> anyhow::Result<()> {
    if redirect == Redirect::Auto {
        datapath::follow_xmit(pin_dir).context("following which interfaces take XDP frames")?;
    } else {
        datapath::XmitMap::open(pin_dir)
            .and_then(|mut m| m.set(&Default::default(), &Default::default()))
            .context("clearing the xmit map")?;
        tracing::warn!("--redirect never: the kernel forwards every packet");
    }
    Ok(())
}

/// Attaches the programs to `interfaces` (and detaches them from those an earlier run
/// attached them to that are no longer given), saying what changed.
fn attach(dp: &mut Datapath, interfaces: &[String], xdp_mode: XdpMode) -> anyhow::Result<()> {
    let mode = match xdp_mode {
        XdpMode::Auto => AttachMode::Auto,
        XdpMode::Native => AttachMode::Native,
        XdpMode::Skb => AttachMode::Skb,
    };
    let changes = dp
        .converge(interfaces, mode)
        .context("attaching to the interfaces (nothing new was left attached)")?;
    for change in changes {
        log_link_change(dp, change, mode);
    }
    Ok(())
}

/// Says what attaching in `mode` changed on one interface.
fn log_link_change(dp: &Datapath, change: LinkChange, mode: AttachMode) {
    match change {
        // The mode stays the earlier run's: native and generic XDP cannot be
        // attached at once, and a switch would leave the interface without the
        // program for a moment (its packets to the host, connections reset).
        LinkChange::Attached {
            iface,
            how: Attached::Replaced(Some(AttachMode::Skb)),
        } if mode == AttachMode::Native => tracing::warn!(
            iface,
            pin = %dp.pin_dir().join("links").display(),
            "--xdp-mode native asked, but an earlier run attached this interface in \
             generic (skb) mode, which its program keeps (replaced in place, flows kept): \
             to change the mode, stop berth, remove the interface's link pin xdp@INDEX \
             there (that detaches it) and start again"
        ),
        LinkChange::Attached {
            iface,
            how: Attached::Replaced(m),
        } => tracing::info!(
            iface,
            mode = ?m,
            "replaced the program an earlier run attached"
        ),
        LinkChange::Attached {
            iface,
            how: Attached::New(m),
        } => tracing::info!(
            iface,
            mode = ?m,
            "attached the XDP and TC programs"
        ),
        LinkChange::Detached { ifindex, iface } => tracing::warn!(
            ifindex,
            iface = iface.as_deref().unwrap_or("(gone)"),
            "detached the programs an earlier run attached: interface not in --interface"
        ),
    }
}

/// Turns ICMP redirects off on `interfaces` (a failure is only said).
fn disable_icmp_redirects(interfaces: &[String]) {
    match berth::host::disable_icmp_redirects(interfaces) {
        Ok(changed) if !changed.is_empty() => tracing::info!(
            settings = changed.join(" "),
            "ICMP redirects off: they would send backends around the gateway's NAT"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "turning ICMP redirects off"
        ),
    }
}

/// Owns the address interface and the announce table, if given: where the gateway
/// addresses are published.
fn publish_addresses(
    dp: &mut Datapath,
    address_interface: Option<&str>,
    announce_table: Option<u32>,
) -> anyhow::Result<()> {
    if let Some(name) = address_interface {
        dp.own_addresses_on(name)
            .context("putting the gateway addresses on their interface")?;
        tracing::info!(
            iface = name,
            "gateway addresses go on this dummy interface (the host answers ARP for them)"
        );
    }
    if let Some(table) = announce_table {
        dp.announce_in_table(table).with_context(|| {
            format!("publishing the gateway addresses in routing table {table}")
        })?;
        tracing::info!(
            table,
            via = address_interface.unwrap_or("lo"),
            "gateway addresses are also routes of protocol berth (251) in this table, for \
             the routing daemon to import"
        );
    }
    Ok(())
}
