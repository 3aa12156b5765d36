//! What a forwarded packet notes in its flow's entries: TCP state flags (`note_tcp`)
//! and when the flow was last seen (`seen`).

use gateway_common::{Addr, Flow, FlowKey, NAT_DST, NAT_SRC, NEXT_HOP_REFRESH};

use super::{Found, Lookup};
use crate::{family::Family, fwd::coarse_now};

/// Notes a TCP segment with one of `TCP_STATE_FLAGS` (`tcp_flags`) in its flow's
/// forward entry (`Flow::note_tcp`), so that the daemon can tell when a connection to a
/// backend that left its service ended (issue 30). `flow` is the translation the packet
/// found (`found`): its forward entry (a forward packet's, or a new flow's before it is
/// recorded), a reply entry (the forward entry is looked up), or the slot of a reply
/// found through its forward entry. A reply matched by Maglev is left alone (rare: its
/// flow is over when idle).
#[inline(always)]
pub fn note_tcp<A: Family>(key: &FlowKey<A>, found: &Lookup<A>, flow: &mut Flow<A>, tcp_flags: u8) {
    let now = coarse_now();
    match found.found {
        // SAFETY: a valid map value pointer for the duration of this program run.
        Found::Reply => unsafe { (*found.entry).note_tcp(tcp_flags, true, now) },
        Found::Tracked | Found::New if flow.kind == NAT_DST => flow.note_tcp(tcp_flags, false, now),
        Found::Tracked if flow.kind == NAT_SRC => note_reply_tcp(key, flow, tcp_flags, now),
        _ => {}
    }
}

/// `note_tcp` for a reply with tuple `key` and translation `reply` (a `NAT_SRC`
/// entry's, or a copy of it): its flow's forward entry (client → gateway) is looked up
/// in this CPU's pending slot (an IPv6 key on the stack took `berth_v6` past its limit).
#[inline(always)]
pub fn note_reply_tcp<A: Family>(key: &FlowKey<A>, reply: &Flow<A>, tcp_flags: u8, now: u32) {
    let Some(slot) = A::pending() else {
        return;
    };
    let k = &mut slot.key;
    (k.proto, k.pad) = (key.proto, [0; 3]);
    if reply.is_snat() {
        (k.src, k.sport) = (reply.peer_addr, reply.peer_port);
    } else {
        (k.src, k.sport) = (key.dst, key.dport);
    }
    (k.dst, k.dport) = (reply.nat_addr, reply.nat_port);
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value, the key would be copied to the stack"
    )]
    if let Some(f) = A::conntrack().get_ptr_mut(&slot.key) {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &mut *f };
        if f.kind == NAT_DST {
            f.note_tcp(tcp_flags, true, now);
        }
    }
}

/// Notes that a forward entry forwarded a packet now (`Flow::seen`, rewritten about once
/// a second: the daemon counts active flows by it).
#[inline(always)]
pub fn seen<A: Addr>(flow: &mut Flow<A>, now: u32) {
    if now.wrapping_sub(flow.seen) > NEXT_HOP_REFRESH {
        flow.seen = now;
    }
}
