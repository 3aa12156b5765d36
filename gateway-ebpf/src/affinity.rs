//! Session affinity by client address (a RouteTrafficPolicy's `sessionAffinity`): a
//! new flow of a service with an affinity timeout (`Service::affinity_secs`) goes to
//! the backend its client's last new flow went to, while that was within the timeout
//! and the backend takes new flows; otherwise Maglev picks by the client's address
//! alone (`conntrack::balance`). Recording a new flow notes its client's backend.

use gateway_common::{Affinity, AffinityKey, ServiceId, BACKEND_LIVE};

use crate::{family::Family, maps::BACKENDS};

/// The backend `client`'s last new flow of `service` went to, if that was at most
/// `secs` seconds before `now` (coarse clock) and the backend still takes the service's
/// new flows.
#[inline(always)]
pub fn kept<A: Family>(service: ServiceId, client: A, secs: u32, now: u32) -> Option<u32> {
    let key = AffinityKey { service, client };
    // SAFETY: the value is copied out at once.
    let last = *unsafe { A::affinity().get(key) }?;
    if now.wrapping_sub(last.at) > units(secs) {
        return None;
    }
    let b = BACKENDS.get(last.backend)?;
    (b.flags & BACKEND_LIVE != 0 && b.weight > 0 && b.service == service).then_some(last.backend)
}

/// Notes that `client`'s new flow of `service` went to `backend` at `now`. (An LRU
/// insert fails only when no entry can be allocated: the next flow notes it again.)
#[inline(always)]
pub fn note<A: Family>(service: ServiceId, client: A, backend: u32, now: u32) {
    let key = AffinityKey { service, client };
    let _ = A::affinity().insert(key, Affinity { backend, at: now }, 0);
}

/// `secs` seconds in the units of the coarse clock (2^20 ns).
#[inline(always)]
fn units(secs: u32) -> u32 {
    ((secs as u64 * 1_000_000_000) >> 20) as u32
}
