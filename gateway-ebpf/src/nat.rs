//! Header rewriting with incremental checksum updates.

use gateway_common::{Flow, NAT_DST};

use crate::{
    csum::{replace2, replace4},
    packet::{Ipv4, Ports},
};

/// The transport header of a packet, when it is present (not in later fragments).
pub struct L4 {
    pub ports: *mut Ports,
    pub check: *mut u16,
    /// UDP: a zero checksum means "none" and stays zero.
    pub udp: bool,
}

/// Applies a flow's translation: `NAT_DST` rewrites the destination address and port,
/// `NAT_SRC` the source.
///
/// # Safety
/// `ip` and the pointers in `l4` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn rewrite(ip: *mut Ipv4, l4: Option<&L4>, flow: &Flow) {
    let dst = flow.kind == NAT_DST;
    let addr = if dst { &mut (*ip).dst } else { &mut (*ip).src };
    let old_addr = *addr;
    *addr = flow.nat_addr;
    (*ip).check = replace4((*ip).check, old_addr, flow.nat_addr);

    let Some(l4) = l4 else {
        return;
    };
    let port = if dst {
        &mut (*l4.ports).dst
    } else {
        &mut (*l4.ports).src
    };
    let old_port = *port;
    *port = flow.nat_port;
    let check = *l4.check;
    if l4.udp && check == 0 {
        return;
    }
    let mut check = replace2(
        replace4(check, old_addr, flow.nat_addr),
        old_port,
        flow.nat_port,
    );
    if l4.udp && check == 0 {
        check = 0xffff;
    }
    *l4.check = check;
}
