//! Load for the end-to-end benchmark, made and counted by two tiny BPF programs loaded
//! with raw `bpf(2)` calls (a few instructions each, no object file, no toolchain):
//!
//! - [`FrameGenerator`]: the kernel's own packet generator, `BPF_PROG_TEST_RUN` with
//!   `BPF_F_TEST_XDP_LIVE_FRAMES`. A thread in the client namespace runs a program over
//!   a template frame again and again; the program counts the frame, gives it the
//!   next flow's 5-tuple ([`Flows`]: source port, source address, destination; a few
//!   long flows, or a new 5-tuple every frame) and redirects it out of the client's
//!   veth. The frames reach the gateway's veth as XDP frames in page-pool
//!   pages with headroom, as a NIC driver hands them over: XDP runs on them in place,
//!   and the stack builds its skb around the page without a copy.
//! - [`Sink`]: on a backend's veth, counts UDP/IPv4 and drops it (ARP and the rest
//!   pass): the cheapest receiver there is, and the same in every mode. As XDP (which
//!   makes the veth take XDP frames) or, where the backend's interface must take none,
//!   at TC ingress (tcx), where the stack has received the packet.

use std::{
    net::SocketAddrV4,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
};

use crate::{netns::Netns, packet::Packet};

mod sink;
pub use sink::Sink;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_LRU_HASH`, the conntrack's type.
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_REDIRECT: i32 = 23;

/// A `bpf_attr`, zero-padded.
type Attr = [u64; 16];

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a zero-padded bpf_attr of the size passed; the pointers in it
    // point at buffers the caller keeps alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn bpf_fd(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<OwnedFd> {
    // SAFETY: a descriptor bpf(2) just returned, owned by nobody else.
    bpf(cmd, attr).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn put_u32(attr: &mut Attr, offset: usize, v: u32) {
    let word = &mut attr[offset / 8];
    let shift = (offset % 8) * 8;
    *word = (*word & !(0xffff_ffffu64 << shift)) | (u64::from(v) << shift);
}

/// One instruction: opcode, destination and source registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst | (src << 4)) << 8)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

// The opcodes used (eBPF instruction set).
const LDXW: u8 = 0x61;
const LDXH: u8 = 0x69;
const LDXB: u8 = 0x71;
const STW: u8 = 0x62;
const STH: u8 = 0x6a;
const STXH: u8 = 0x6b;
const MOV: u8 = 0xbf;
const MOVI: u8 = 0xb7;
const ADDI: u8 = 0x07;
const MODI: u8 = 0x97;
const DIVI: u8 = 0x37;
const ADD: u8 = 0x0f;
const ANDI: u8 = 0x57;
const XORI: u8 = 0xa7;
const RSHI: u8 = 0x77;
const TO_BE: u8 = 0xdc;
const JA: u8 = 0x05;
const JEQI: u8 = 0x15;
const JNEI: u8 = 0x55;
const JGT: u8 = 0x2d;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const ATOMIC_DW: u8 = 0xdb;
const ATOMIC_ADD: i32 = 0x00;
const ATOMIC_FETCH_ADD: i32 = 0x01;
const LD_MAP_FD: u8 = 0x18;

/// `r0 = &map[0]` or jump `to_null` (an absolute instruction index) if absent; `at` is
/// the index of the first of its seven slots (the map load takes two). Clobbers r1-r5.
fn lookup_counter(map: &OwnedFd, at: i16, to_null: i16) -> [u64; 7] {
    [
        insn(STW, 10, 0, -4, 0),                     // key = 0
        insn(LD_MAP_FD, 1, 1, 0, map.as_raw_fd()),   // r1 = map
        0,                                           // (second half)
        insn(MOV, 2, 10, 0, 0),                      // r2 = fp
        insn(ADDI, 2, 0, 0, -4),                     // r2 = &key
        insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM), // r0 = &value or NULL
        insn(JEQI, 0, 0, to_null - (at + 7), 0),     // if !r0 goto to_null
    ]
}

/// Creates a BPF map of `map_type` with these sizes and pins it at `path`, as an older
/// build would have left it (for tests of what a new daemon does with it).
pub fn create_pinned_map(
    path: &std::path::Path,
    map_type: u32,
    key_size: u32,
    value_size: u32,
    entries: u32,
) -> std::io::Result<()> {
    let mut attr = Attr::default();
    put_u32(&mut attr, 0, map_type);
    put_u32(&mut attr, 4, key_size);
    put_u32(&mut attr, 8, value_size);
    put_u32(&mut attr, 12, entries);
    let map = bpf_fd(BPF_MAP_CREATE, &mut attr)?;
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    let mut attr = Attr::default();
    attr[0] = path.as_ptr() as u64;
    put_u32(&mut attr, 8, map.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// An array map of one u64 counter.
struct Counter(OwnedFd);

impl Counter {
    fn new() -> Self {
        let mut attr = Attr::default();
        put_u32(&mut attr, 0, BPF_MAP_TYPE_ARRAY);
        put_u32(&mut attr, 4, 4); // key size
        put_u32(&mut attr, 8, 8); // value size
        put_u32(&mut attr, 12, 1); // entries
        Counter(bpf_fd(BPF_MAP_CREATE, &mut attr).expect("creating a BPF array map"))
    }

    fn get(&self) -> u64 {
        let key = 0u32;
        let mut value = 0u64;
        let mut attr = Attr::default();
        put_u32(&mut attr, 0, self.0.as_raw_fd() as u32);
        attr[1] = &key as *const u32 as u64;
        attr[2] = &mut value as *mut u64 as u64;
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).expect("reading a BPF counter");
        value
    }

    fn set(&self, value: u64) {
        let key = 0u32;
        let mut attr = Attr::default();
        put_u32(&mut attr, 0, self.0.as_raw_fd() as u32);
        attr[1] = &key as *const u32 as u64;
        attr[2] = &value as *const u64 as u64;
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).expect("setting a BPF counter");
    }
}

fn load_xdp(what: &str, insns: &[u64]) -> OwnedFd {
    load(what, BPF_PROG_TYPE_XDP, BPF_XDP, insns)
}

/// Loads a program of `prog_type` for `attach_type`.
fn load(what: &str, prog_type: u32, attach_type: u32, insns: &[u64]) -> OwnedFd {
    let license = b"GPL\0";
    let mut log = vec![0u8; 1 << 16];
    let mut attr = Attr::default();
    put_u32(&mut attr, 0, prog_type);
    put_u32(&mut attr, 4, insns.len() as u32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    put_u32(&mut attr, 24, 1); // log level
    put_u32(&mut attr, 28, log.len() as u32);
    attr[4] = log.as_mut_ptr() as u64;
    put_u32(&mut attr, 68, attach_type); // expected attach type
    bpf_fd(BPF_PROG_LOAD, &mut attr).unwrap_or_else(|e| {
        let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
        panic!(
            "loading the {what} program: {e}\n{}",
            String::from_utf8_lossy(&log[..end])
        )
    })
}

/// Pins a thread (`0`: the calling one) or process to one CPU.
pub fn pin(pid: u32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(pid as i32, std::mem::size_of_val(&set), &set)
    };
    assert_eq!(
        rc,
        0,
        "pinning {pid} to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// Frames per `BPF_PROG_TEST_RUN` call (each call swaps the XDP dispatcher, an RCU
/// grace period, so calls are long; stopping waits for the current one).
const FRAMES_PER_CALL: u32 = 1 << 20;

/// Which 5-tuples a [`FrameGenerator`] cycles through. Frame `n` (the generator's
/// count before it) has source port `template's + n % ports`, source address
/// `template's + (n / ports) % addresses` (added to its last 16 bits) and destination
/// `dsts[n % dsts.len()]`: `ports × addresses` distinct 5-tuples before one repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flows {
    /// Source ports, from the template's up.
    pub ports: u32,
    /// Source addresses, from the template's up.
    pub addresses: u32,
}

impl Flows {
    /// Distinct 5-tuples before one repeats.
    pub fn tuples(self) -> u64 {
        u64::from(self.ports) * u64::from(self.addresses)
    }
}

/// The frame [`FrameGenerator`] sends as its `n`th (0-based), built from scratch: what
/// its program must write.
pub fn generated_frame(template: &Packet, flows: Flows, dsts: &[SocketAddrV4], n: u64) -> Vec<u8> {
    let (sport, dport) = udp_ports(template);
    let ports = u64::from(flows.ports);
    let port = u64::from(sport) + n % ports;
    let addr = u32::from(template.src) as u64 + (n / ports) % u64::from(flows.addresses);
    let dst = dsts[(n % dsts.len() as u64) as usize];
    template
        .clone()
        .with_src(SocketAddrV4::new((addr as u32).into(), port as u16))
        .with_dst(SocketAddrV4::new(*dst.ip(), dport))
        .frame()
}

/// The frames the generator's program writes when its count is at each of `counts`
/// (run once each by `BPF_PROG_TEST_RUN` without live frames, over `template` with
/// its TTL and MACs spoiled, as a receiving stack leaves a page).
pub fn generator_output(
    template: &Packet,
    flows: Flows,
    dsts: &[SocketAddrV4],
    counts: &[u64],
) -> Vec<Vec<u8>> {
    let counter = Counter::new();
    let prog = load_xdp(
        "generator",
        &generator_program(template, flows, dsts, &counter, 1),
    );
    let mut input = template.clone().ttl(1).macs([0; 6], [0xff; 6]).frame();
    counts
        .iter()
        .map(|&n| {
            counter.set(n);
            let mut out = vec![0u8; input.len() + 256];
            let mut attr = Attr::default();
            put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
            put_u32(&mut attr, 8, input.len() as u32);
            put_u32(&mut attr, 12, out.len() as u32);
            attr[2] = input.as_mut_ptr() as u64;
            attr[3] = out.as_mut_ptr() as u64;
            put_u32(&mut attr, 32, 1); // repeat
            bpf(BPF_PROG_TEST_RUN, &mut attr).expect("BPF_PROG_TEST_RUN of the generator");
            let len = (attr[1] >> 32) as usize; // data_size_out
            out.truncate(len);
            out
        })
        .collect()
}

fn udp_ports(template: &Packet) -> (u16, u16) {
    match template.l4 {
        crate::packet::L4::Udp {
            sport,
            dport,
            checksum: false,
        } => (sport, dport),
        _ => panic!("the generator's template must be UDP without checksum"),
    }
}

/// The generator's program: counts the frame, takes the count before as `n`, writes
/// the headers of `template` afresh (the stack that received the frame may have
/// changed them: TTL, MACs, NAT, and the page comes back as it was left: Ethernet,
/// IPv4, UDP, 42 bytes), then flow `n`'s fields (see [`Flows`]), and redirects the
/// frame out of `ifindex`.
fn generator_program(
    template: &Packet,
    flows: Flows,
    dsts: &[SocketAddrV4],
    counter: &Counter,
    ifindex: u32,
) -> Vec<u64> {
    assert!(template.options.is_empty() && !dsts.is_empty());
    let (base_port, dport) = udp_ports(template);
    assert!(flows.ports >= 1 && u32::from(base_port) + flows.ports <= 1 << 16);
    // The last 16 bits of the source address, as a number.
    let base_low = u32::from(template.src) & 0xffff;
    assert!(flows.addresses >= 1 && base_low + flows.addresses <= 1 << 16);
    let frame = template.frame();
    let header = &frame[..42];
    let blocks = 34;
    let vary = blocks + 4 * dsts.len() as i16;
    let vary_len = if flows.addresses > 1 { 18 } else { 0 };
    let send = vary + vary_len;
    let mut p = vec![insn(MOV, 6, 1, 0, 0)]; // 0: r6 = ctx
    p.extend(lookup_counter(&counter.0, 1, send)); // 1-7: r0 = &counter
    p.extend([
        insn(MOVI, 1, 0, 0, 1),                     // 8: r1 = 1
        insn(ATOMIC_DW, 0, 1, 0, ATOMIC_FETCH_ADD), // 9: r1 = (*r0)++
        insn(MOV, 7, 1, 0, 0),                      // 10: r7 = n
        insn(LDXW, 2, 6, 0, 0),                     // 11: r2 = data
        insn(LDXW, 3, 6, 4, 0),                     // 12: r3 = data_end
        insn(MOV, 4, 2, 0, 0),                      // 13: r4 = data
        insn(ADDI, 4, 0, 0, header.len() as i32),   // 14: r4 += headers
        insn(JGT, 4, 3, send - 16, 0),              // 15: too short: send as is
    ]);
    for (i, w) in header[..40].chunks(4).enumerate() {
        let word = i32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        p.push(insn(STW, 2, 0, 4 * i as i16, word)); // 16-25: headers
    }
    p.extend([
        insn(
            STH,
            2,
            0,
            40,
            i32::from(u16::from_le_bytes([header[40], header[41]])),
        ), // 26
        insn(MOV, 5, 7, 0, 0),                     // 27: r5 = n
        insn(MODI, 5, 0, 0, flows.ports as i32),   // 28: r5 = n % ports
        insn(ADDI, 5, 0, 0, i32::from(base_port)), // 29: r5 += first port
        insn(TO_BE, 5, 0, 0, 16),                  // 30: r5 = htons(r5)
        insn(STXH, 2, 5, 34, 0),                   // 31: UDP source port = r5
        insn(MOV, 1, 7, 0, 0),                     // 32: r1 = n
        insn(MODI, 1, 0, 0, dsts.len() as i32),    // 33: r1 = destination index
    ]);
    assert_eq!(p.len() as i16, blocks);
    for (i, dst) in dsts.iter().enumerate() {
        assert_eq!(dst.port(), dport, "one destination port");
        let f = template.clone().with_dst(*dst).frame();
        let at = blocks + 4 * i as i16;
        p.extend([
            insn(JNEI, 1, 0, 3, i as i32), // not this one: next
            insn(
                STW,
                2,
                0,
                30,
                i32::from_le_bytes([f[30], f[31], f[32], f[33]]),
            ),
            insn(STH, 2, 0, 24, i32::from(u16::from_le_bytes([f[24], f[25]]))),
            insn(JA, 0, 0, vary - (at + 4), 0),
        ]);
    }
    if flows.addresses > 1 {
        // Source address + a, a = (n / ports) % addresses, and the IPv4 checksum
        // updated for it (RFC 1624: sum' = sum + a, folded; the sum is ~checksum).
        p.extend([
            insn(MOV, 5, 7, 0, 0),                       // r5 = n
            insn(DIVI, 5, 0, 0, flows.ports as i32),     // r5 /= ports
            insn(MODI, 5, 0, 0, flows.addresses as i32), // r5 = a
            insn(MOV, 4, 5, 0, 0),                       // r4 = a
            insn(ADDI, 4, 0, 0, base_low as i32),        // r4 += the address's last 16 bits
            insn(TO_BE, 4, 0, 0, 16),                    // r4 = htons(r4)
            insn(STXH, 2, 4, 28, 0),                     // source address, last 16 bits = r4
            insn(LDXH, 3, 2, 24, 0),                     // r3 = checksum as sent
            insn(TO_BE, 3, 0, 0, 16),                    // r3 = ntohs(r3)
            insn(XORI, 3, 0, 0, 0xffff),                 // r3 = sum
            insn(ADD, 3, 5, 0, 0),                       // r3 += a
            insn(MOV, 4, 3, 0, 0),                       // r4 = r3
            insn(RSHI, 4, 0, 0, 16),                     // r4 = carry
            insn(ANDI, 3, 0, 0, 0xffff),                 // r3 &= 0xffff
            insn(ADD, 3, 4, 0, 0),                       // r3 += carry
            insn(XORI, 3, 0, 0, 0xffff),                 // r3 = ~sum
            insn(TO_BE, 3, 0, 0, 16),                    // r3 = htons(r3)
            insn(STXH, 2, 3, 24, 0),                     // IPv4 checksum = r3
        ]);
    }
    assert_eq!(p.len() as i16, send);
    p.extend([
        insn(MOVI, 1, 0, 0, ifindex as i32),  // r1 = the interface
        insn(MOVI, 2, 0, 0, 0),               // r2 = 0
        insn(CALL, 0, 0, 0, HELPER_REDIRECT), // r0 = XDP_REDIRECT
        insn(EXIT, 0, 0, 0, 0),
    ]);
    p
}

/// The kernel sending frames as fast as one CPU can, from a thread of this process in
/// the client namespace; stopped on drop.
pub struct FrameGenerator {
    counter: Counter,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FrameGenerator {
    /// Starts sending `template` (an Ethernet frame from the client to the gateway's
    /// MAC, UDP without checksum) out of `iface` of `ns`, on `cpu`, through `flows`
    /// (destinations: `dsts`, addresses only; the port is `template`'s).
    pub fn start(
        ns: &Netns,
        iface: &str,
        template: &Packet,
        flows: Flows,
        dsts: &[SocketAddrV4],
        cpu: usize,
    ) -> Self {
        let frame = template.frame();
        let counter = Counter::new();
        let p = generator_program(template, flows, dsts, &counter, ns.ifindex(iface));
        let prog = load_xdp("generator", &p);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = ns.spawn_thread(move || {
            pin(0, cpu);
            // xdp_md: data, data_end, data_meta, ingress_ifindex (0: loopback, whose
            // namespace resolves the redirect), rx_queue_index, egress_ifindex.
            let ctx: [u32; 6] = [0, frame.len() as u32, 0, 0, 0, 0];
            while !stopped.load(Ordering::Relaxed) {
                let mut attr = Attr::default();
                put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
                put_u32(&mut attr, 8, frame.len() as u32);
                attr[2] = frame.as_ptr() as u64;
                put_u32(&mut attr, 32, FRAMES_PER_CALL);
                put_u32(&mut attr, 40, std::mem::size_of_val(&ctx) as u32);
                attr[6] = ctx.as_ptr() as u64;
                put_u32(&mut attr, 64, BPF_F_TEST_XDP_LIVE_FRAMES);
                put_u32(&mut attr, 72, 64); // frames per batch
                if let Err(e) = bpf(BPF_PROG_TEST_RUN, &mut attr) {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        panic!("BPF_PROG_TEST_RUN with live frames: {e}");
                    }
                }
            }
        });
        FrameGenerator {
            counter,
            stop,
            thread: Some(thread),
        }
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.counter.get()
    }

    /// Panics if the sending thread has stopped.
    pub fn assert_running(&mut self) {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            if let Some(Err(e)) = self.thread.take().map(JoinHandle::join) {
                std::panic::resume_unwind(e);
            }
            panic!("the frame generator stopped");
        }
    }
}

impl Drop for FrameGenerator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
