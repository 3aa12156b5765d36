//! Flow lookup and backend selection: the conntrack hit path and weighted Maglev.
//!
//! Here: the lookup (`lookup_or_balance`) and what it answers. By concern, in
//! submodules: `entry` (the entry under a packet's own tuple, whether an entry still
//! applies, recording a flow's entries), `replies` (a reply matched to its flow, and
//! `find`), `state` (what a forwarded packet notes in its entry), `balance` (weighted
//! Maglev and the SNAT port claim) and `flood` (the new-flow limit).
//!
//! The split keeps the compiled program as it was in one file, and that depends on
//! the submodules' names: rustc hands LLVM a crate's functions sorted by symbol name,
//! and LLVM inlines `#[inline(always)]` functions in that order, which decides stack
//! slots and registers (with `find` placed before the functions it calls,
//! `berth_icmp6` grew by 48 bytes). A function's symbol starts with its module path,
//! each name prefixed by its length: this module's functions come first, then the
//! submodules by length and name (`entry`, `flood`, `state`, `balance`, `replies`),
//! and within each by length and name, which is the order these functions had. Moving
//! a function to another of these files, or renaming a file, changes the program:
//! compare the object's program sections before and after (`readelf -x`).

mod balance;
mod entry;
mod flood;
mod replies;
mod state;

use core::mem::MaybeUninit;

use gateway_common::{proto, Addr, Counter, Flow, FlowKey, Service, ServiceKey, SERVICE_SNAT};

use self::{
    balance::balance,
    entry::{direct, takes_new_flows, Direct},
    replies::{checked, reply_of},
};
pub use self::{
    entry::{add_kernel_path_entries, applies, holds_port, record, tuple},
    replies::{find, Spoofed},
    state::{note_reply_tcp, note_tcp, seen},
};
use crate::{
    affinity,
    family::Family,
    fwd::coarse_now,
    maps::{count, is_gateway_address, Roles},
    origin::Origin,
    packet::{TCP_ACK, TCP_SYN},
};

/// What the conntrack says about a packet.
///
/// (Flows are returned through a caller-owned slot, and the entry as a pointer beside
/// this kind, rather than as enum payloads: an enum whose variants differ in size is
/// copied with undefined bytes, which LLVM may then read from registers the verifier
/// considers uninitialised.)
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Not ours.
    Miss,
    /// A tracked flow: `Lookup::entry` is its entry in the map, updated in place
    /// (next-hop cache).
    Tracked,
    /// A router-mode reply: `Lookup::entry` is its flow's forward entry (found through
    /// the reply index; the reply's next hop is cached in its `next_hop`). The caller's
    /// slot holds the reply's translation as a `NAT_SRC` flow.
    Reply,
    /// The first packet of a flow: the new flow is in the caller's slot, to be recorded
    /// with `record` once forwarded (so the entry starts with its next hop cached).
    New,
    /// A router-mode reply whose flow had no entry, matched by Maglev (`reply_of`): its
    /// translation is in the caller's slot; its flow was recorded (unless the flood
    /// guard refused), without a next hop cached.
    Matched,
    /// A reply (or ICMP error) of a flow that did not come from where its backend is
    /// (`origin.rs`): to be dropped as `reply_spoofed`. Nothing was recorded.
    Spoofed,
}

/// Whether `reply_of` looks for an entry under the reply's own tuple (a SNAT flow's
/// reply or kernel-path entry, or a shared endpoint's reply entry), before a reply is
/// taken for one with no entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OwnEntry {
    /// No: the caller looked already (`lookup_or_balance`, a packet to a gateway
    /// address too).
    Looked,
    /// An entry XDP may translate with (`direct`); XDP counts `reply_untracked`.
    Xdp,
    /// Any entry, as it is: the caller checks it (`find`: TC and ICMP errors).
    Any,
}

/// What `reply_of` does with a reply whose flow has no entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NoEntry {
    /// Matches it by Maglev: if its service's table maps the flow's forward tuple to the
    /// backend the reply came from, translates it and records the flow (a packet of the
    /// flow, XDP or TC: whichever gateway behind ECMP it reaches carries it).
    Maglev,
    /// Leaves it untranslated (an ICMP error: only errors about flows with an entry are
    /// translated).
    Leave,
}

/// A lookup's answer: what was found and, for `Tracked` and `Reply`, the entry (null
/// otherwise).
pub struct Lookup<A: Addr = u32> {
    pub found: Found,
    pub entry: *mut Flow<A>,
}

impl<A: Addr> Lookup<A> {
    #[inline(always)]
    fn of(found: Found, entry: *mut Flow<A>) -> Self {
        Lookup { found, entry }
    }

    #[inline(always)]
    fn only(found: Found) -> Self {
        Lookup {
            found,
            entry: core::ptr::null_mut(),
        }
    }
}

/// Finds the flow of the packet with tuple `t`, or balances it to a backend (written
/// to `new`, left untouched otherwise) when it is the first packet to a service (or
/// the first since its entry stopped applying, see `applies`).
///
/// The packet's `roles` say which lookups can find something (a packet with neither
/// role is passed before it gets here). A TCP SYN (`syn`) to a router-mode service is a
/// new flow by definition and skips the conntrack lookup (a retransmitted SYN gets the
/// same backend from Maglev); a SNAT flow's SYN is looked up, so that a retransmission
/// keeps the node port its flow claimed. A TCP segment without SYN that gets here had
/// no entry (it began on another gateway behind the same ECMP route, or its entry was
/// evicted): Maglev gives it the backend every gateway gives it (`ct_miss_midflow`).
///
/// `flags` are a TCP segment's flags (byte 13 of its header; a later fragment's are
/// taken for a mid-flow segment's, `MIDFLOW`). A packet that would open a flow with
/// flags no TCP sends (`invalid_flags`), or from a gateway address, is dropped
/// (`drop_tcp_flags`, `drop_gateway_source`): only where a flow would be opened, so
/// tracked flows pay nothing. A reply (an entry of kind `NAT_SRC`) that did not come
/// from where its backend is (`origin`) is dropped (`reply_spoofed`).
#[inline(always)]
pub fn lookup_or_balance<A: Family>(
    t: &FlowKey<A>,
    roles: Roles,
    flags: u8,
    origin: &Origin,
    new: &mut MaybeUninit<Flow<A>>,
) -> Result<Lookup<A>, Counter> {
    let Roles {
        to_gateway,
        from_backend,
    } = roles;
    let syn = t.proto == proto::TCP && flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    // The service of a forward entry that no longer applies.
    let mut stale = None;
    let mut looked = false;
    if to_gateway && !syn {
        looked = true;
        match direct(t) {
            // A SNAT flow's reply entry is keyed by the node's address.
            Direct::Hit(flow) => return checked(Lookup::of(Found::Tracked, flow), t, origin),
            Direct::Stale(id) => stale = Some(id),
            Direct::None => {}
        }
    }
    if from_backend {
        let own = if looked {
            OwnEntry::Looked
        } else {
            OwnEntry::Xdp
        };
        if let Some(found) = reply_of(t, own, NoEntry::Maglev, origin, new) {
            if found.found == Found::Spoofed {
                return Err(Counter::ReplySpoofed);
            }
            return Ok(found);
        }
        looked = true;
    }
    if !to_gateway {
        return Ok(Lookup::only(Found::Miss));
    }
    let key = ServiceKey {
        addr: t.dst,
        port: t.dport,
        proto: t.proto,
        pad: 0,
    };
    // SAFETY: the value is copied out at once.
    let service = (unsafe { A::services().get(key) }).copied();
    let Some(service) = service else {
        if stale.is_some() {
            count(Counter::CtStaleService);
        }
        return Ok(Lookup::only(Found::Miss));
    };
    if !looked && service.flags & SERVICE_SNAT != 0 {
        match direct(t) {
            // A SYN reopens the tuple (or retransmits the first): a new connection,
            // which goes to a backend that takes new flows (its backend may have turned
            // not ready, or left and kept its connections only, since).
            Direct::Hit(flow) if syn && !takes_new_flows(flow) => stale = Some(service.id),
            Direct::Hit(flow) => return Ok(Lookup::of(Found::Tracked, flow)),
            Direct::Stale(id) => stale = Some(id),
            Direct::None => {}
        }
    }
    opens_flow(t, flags)?;
    if let Some(old) = stale {
        // The service the packet addresses is the flow's own (its key is the flow's
        // service key): same id, so only the backend went; else the service went.
        count(if service.id == old {
            Counter::BackendGone
        } else {
            Counter::CtStaleService
        });
    }
    // A new flow of a service with session affinity: its client's backend, if kept.
    let kept = match Service::affinity_secs(service.flags) {
        0 => None,
        secs => affinity::kept(service.id, t.src, secs, coarse_now()),
    };
    balance(t, &service, new, kept)?;
    if t.proto == proto::TCP && !syn {
        count(Counter::CtMissMidflow);
    }
    Ok(Lookup::only(Found::New))
}

/// A later fragment's flags: taken for a mid-flow segment's (its first fragment was
/// checked).
pub const MIDFLOW: u8 = TCP_ACK;

/// Whether a packet with tuple `t` and TCP flags `flags` (see `lookup_or_balance`) may
/// open a flow: a TCP segment with valid flags (`invalid_flags`), from an address that
/// is not a gateway address.
#[inline(always)]
fn opens_flow<A: Family>(t: &FlowKey<A>, flags: u8) -> Result<(), Counter> {
    if t.proto == proto::TCP && invalid_flags(flags) {
        return Err(Counter::DropTcpFlags);
    }
    // The filter first: an array lookup, where the address map is a hash.
    if Roles::may_be_gateway(t.src) && is_gateway_address(t.src) {
        return Err(Counter::DropGatewaySource);
    }
    Ok(())
}

/// TCP flag combinations no TCP sends, which scanners and fingerprinting tools do
/// (and which, balanced as a new flow, reached a backend): no flag among FIN, SYN,
/// RST, PSH, ACK, URG; SYN with FIN or RST; FIN, PSH and URG together (Xmas).
#[inline(always)]
pub fn invalid_flags(flags: u8) -> bool {
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    const PSH: u8 = 0x08;
    const URG: u8 = 0x20;
    flags & 0x3f == 0
        || flags & (TCP_SYN | FIN) == TCP_SYN | FIN
        || flags & (TCP_SYN | RST) == TCP_SYN | RST
        || flags & (FIN | PSH | URG) == FIN | PSH | URG
}
