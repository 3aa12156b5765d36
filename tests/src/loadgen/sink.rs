//! [`Sink`]: counts and drops UDP (over IPv4 or IPv6) on a backend's interface, as native XDP or at
//! TC ingress (tcx).

use super::*;

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
const TC_ACT_UNSPEC: i32 = -1;
const TC_ACT_SHOT: i32 = 2;

/// Where a [`Sink`] runs: its program type, attach type, the offsets of the packet's
/// start and end in its context and what it returns to drop or to pass a packet.
struct Hook {
    prog_type: u32,
    attach_type: u32,
    data: i16,
    data_end: i16,
    drop: i32,
    pass: i32,
}

/// Native XDP: `xdp_md`'s data and data_end.
const XDP_HOOK: Hook = Hook {
    prog_type: BPF_PROG_TYPE_XDP,
    attach_type: BPF_XDP,
    data: 0,
    data_end: 4,
    drop: XDP_DROP,
    pass: XDP_PASS,
};

/// TC ingress (tcx): `__sk_buff`'s data and data_end; there, data points at the
/// Ethernet header.
const TCX_INGRESS_HOOK: Hook = Hook {
    prog_type: BPF_PROG_TYPE_SCHED_CLS,
    attach_type: BPF_TCX_INGRESS,
    data: 76,
    data_end: 80,
    drop: TC_ACT_SHOT,
    pass: TC_ACT_UNSPEC,
};

/// Counts and drops UDP over IPv4 or IPv6 (no extension headers) arriving on an interface; detached on drop.
pub struct Sink {
    counter: Counter,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl Sink {
    /// Attaches to `iface` of `ns` (native XDP): the interface then takes XDP frames.
    pub fn attach(ns: &Netns, iface: &str) -> Self {
        Self::attach_at(ns, iface, &XDP_HOOK)
    }

    /// Attaches to `iface` of `ns` at TC ingress (tcx, a BPF link): counts what the
    /// stack receives there, with no XDP on the interface.
    pub fn attach_tc(ns: &Netns, iface: &str) -> Self {
        Self::attach_at(ns, iface, &TCX_INGRESS_HOOK)
    }

    fn attach_at(ns: &Netns, iface: &str, hook: &Hook) -> Self {
        let counter = Counter::new();
        const V4: i16 = 12;
        const DROP: i16 = 23;
        const PASS: i16 = 25;
        let mut p = vec![
            insn(LDXW, 2, 1, hook.data, 0),     // 0: r2 = data
            insn(LDXW, 3, 1, hook.data_end, 0), // 1: r3 = data_end
            insn(MOV, 4, 2, 0, 0),              // 2: r4 = data
            insn(ADDI, 4, 0, 0, 14 + 20),       // 3: r4 += Ethernet + IPv4
            insn(JGT, 4, 3, PASS - 5, 0),       // 4: too short: pass
            insn(LDXH, 5, 2, 12, 0),            // 5: r5 = EtherType
            insn(JEQI, 5, 0, V4 - 7, 0x0008),   // 6: IPv4 (0x0800 on the wire)
            insn(JNEI, 5, 0, PASS - 8, 0xdd86), // 7: not IPv6 (0x86dd) either: pass
            insn(ADDI, 4, 0, 0, 20),            // 8: r4 = data + Ethernet + IPv6
            insn(JGT, 4, 3, PASS - 10, 0),      // 9: too short: pass
            insn(LDXB, 5, 2, 14 + 6, 0),        // 10: r5 = IPv6 next header
            insn(JA, 0, 0, V4 + 1 - 12, 0),     // 11: to the protocol check
            insn(LDXB, 5, 2, 14 + 9, 0),        // 12 (V4): r5 = IPv4 protocol
            insn(JNEI, 5, 0, PASS - 14, 17),    // 13: not UDP: pass
        ];
        p.extend(lookup_counter(&counter.0, 14, DROP)); // 14-20: r0 = &counter
        p.extend([
            insn(MOVI, 1, 0, 0, 1),               // 21: r1 = 1
            insn(ATOMIC_DW, 0, 1, 0, ATOMIC_ADD), // 22: *r0 += r1
            insn(MOVI, 0, 0, 0, hook.drop),       // 23 (DROP)
            insn(EXIT, 0, 0, 0, 0),               // 24
            insn(MOVI, 0, 0, 0, hook.pass),       // 25 (PASS)
            insn(EXIT, 0, 0, 0, 0),               // 26
        ]);
        assert_eq!(p.len() as i16, PASS + 2);
        let prog = load("sink", hook.prog_type, hook.attach_type, &p);
        let ifindex = ns.ifindex(iface);
        let link = ns
            .enter(|| {
                // link_create: prog_fd, target_ifindex, attach_type, flags 0.
                let mut attr = Attr::default();
                put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
                put_u32(&mut attr, 4, ifindex);
                put_u32(&mut attr, 8, hook.attach_type);
                bpf_fd(BPF_LINK_CREATE, &mut attr)
            })
            .unwrap_or_else(|e| panic!("attaching the sink to {iface} in {}: {e}", ns.name));
        Sink {
            counter,
            _prog: prog,
            _link: link,
        }
    }

    /// UDP packets counted (and dropped) so far.
    pub fn count(&self) -> u64 {
        self.counter.get()
    }
}
