//! Load for the end-to-end benchmark, made and counted by two tiny BPF programs loaded
//! with raw `bpf(2)` calls (a few instructions each, no object file, no toolchain):
//!
//! - [`FrameGenerator`]: the kernel's own packet generator, `BPF_PROG_TEST_RUN` with
//!   `BPF_F_TEST_XDP_LIVE_FRAMES`. A thread in the client namespace runs a program over
//!   a template frame ([`Template`]: UDP over IPv4 without checksum, or over IPv6
//!   with one) again and again; the program counts the frame, gives it the next
//!   flow's 5-tuple ([`Flows`]: source port, source address, destination; a few long
//!   flows, or a new 5-tuple every frame), updates the checksum those fields are under
//!   (IPv4's header checksum, IPv6's UDP checksum) and redirects it out of the
//!   client's veth. The frames reach the gateway's veth as XDP frames in page-pool
//!   pages with headroom, as a NIC driver hands them over: XDP runs on them in place,
//!   and the stack builds its skb around the page without a copy.
//! - [`Sink`]: on a backend's veth, counts UDP over IPv4 or IPv6 and drops it (ARP,
//!   neighbour discovery and the rest pass): the cheapest receiver there is, and the same in every mode. As XDP (which
//!   makes the veth take XDP frames) or, where the backend's interface must take none,
//!   at TC ingress (tcx), where the stack has received the packet.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{netns::Netns, packet::Packet};

mod generator;
mod packet_socket;
mod sink;
pub use generator::{generated_frame, generator_output, Flows, FrameGenerator, Template};
pub use packet_socket::PacketGenerator;
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

/// Whether the kernel runs XDP programs over live frames (`BPF_PROG_TEST_RUN` with
/// `BPF_F_TEST_XDP_LIVE_FRAMES`), which the frame generator needs: Err with the
/// kernel's refusal (the 6.18 kernel of the `polyglot` machines since 2026-12-07 says
/// EPERM) otherwise. Tried with a program that drops its one frame.
pub fn live_frames() -> std::io::Result<()> {
    let prog = load_xdp(
        "live-frames probe",
        &[insn(MOVI, 0, 0, 0, 1), insn(EXIT, 0, 0, 0, 0)],
    );
    let frame = [0u8; 60];
    let ctx = [0u32, frame.len() as u32, 0, 0, 0, 0];
    let mut attr = Attr::default();
    put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
    put_u32(&mut attr, 8, frame.len() as u32);
    attr[2] = frame.as_ptr() as u64;
    put_u32(&mut attr, 32, 1);
    put_u32(&mut attr, 40, std::mem::size_of_val(&ctx) as u32);
    attr[6] = ctx.as_ptr() as u64;
    put_u32(&mut attr, 64, BPF_F_TEST_XDP_LIVE_FRAMES);
    bpf(BPF_PROG_TEST_RUN, &mut attr).map(|_| ())
}

/// A sending thread in a namespace, told to stop (and joined) on drop: what both
/// generators run their loop in.
struct Sender {
    what: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sender {
    /// Runs `body` on a thread in `ns`; `body` sends until its argument says stop.
    fn spawn(
        what: &'static str,
        ns: &Netns,
        body: impl FnOnce(&std::sync::atomic::AtomicBool) + Send + 'static,
    ) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = ns.spawn_thread(move || body(&stopped));
        Sender {
            what,
            stop,
            thread: Some(thread),
        }
    }

    /// Whether to stop, for `body`'s loop.
    fn stopping(stop: &std::sync::atomic::AtomicBool) -> bool {
        stop.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Panics if the thread has stopped (with its panic, if it panicked).
    fn assert_running(&mut self) {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            if let Some(Err(e)) = self.thread.take().map(std::thread::JoinHandle::join) {
                std::panic::resume_unwind(e);
            }
            panic!("the {} stopped", self.what);
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
