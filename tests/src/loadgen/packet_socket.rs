//! [`PacketGenerator`]: the same frames as [`FrameGenerator`](super::FrameGenerator)
//! (`generated_frame`: every flow's 5-tuple, checksums right), written by a thread in
//! the client namespace to an `AF_PACKET` socket on the client's veth with `sendmmsg`,
//! past the qdisc. For kernels that refuse live frames to `BPF_PROG_TEST_RUN` (this
//! project's 6.18 machines since 2026-12-07). The frames leave as the client's skbs,
//! so they reach the gateway's veth with little headroom: where XDP runs there, the veth
//! copies each into a page first (a cost the live-frame generator, and a NIC, do not
//! cause), as with the `sendmmsg` load.

use std::{
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use super::{generated_frame, Flows, Sender, Template};
use crate::netns::Netns;

/// Frames per `sendmmsg`.
const BATCH: usize = 64;
/// `SOL_PACKET` option: send straight to the driver, past the qdisc.
const PACKET_QDISC_BYPASS: libc::c_int = 20;

/// A running generator; stops when dropped.
pub struct PacketGenerator {
    sent: Arc<AtomicU64>,
    sender: Sender,
}

impl PacketGenerator {
    /// Starts sending `template`'s frames through `flows` to `dsts` out of `iface` of
    /// `ns`, on `cpu`.
    pub fn start(
        ns: &Netns,
        iface: &str,
        template: &Template,
        flows: Flows,
        dsts: &[IpAddr],
        cpu: usize,
    ) -> Self {
        let ifindex = ns.ifindex(iface);
        let sent = Arc::new(AtomicU64::new(0));
        let counted = sent.clone();
        let (template, dsts) = (template.clone(), dsts.to_vec());
        let sender = Sender::spawn("packet-socket generator", ns, move |stopped| {
            super::pin(0, cpu);
            let sock = socket(ifindex);
            let mut frames: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
            let mut n = 0u64;
            while !Sender::stopping(stopped) {
                frames.clear();
                frames.extend(
                    (0..BATCH as u64).map(|i| generated_frame(&template, flows, &dsts, n + i)),
                );
                let written = send(&sock, &mut frames);
                n += written;
                counted.fetch_add(written, Ordering::Relaxed);
            }
        });
        PacketGenerator { sent, sender }
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Panics if the sending thread has stopped.
    pub fn assert_running(&mut self) {
        self.sender.assert_running();
    }
}

/// An `AF_PACKET` raw socket bound to `ifindex` (receiving nothing), past the qdisc.
fn socket(ifindex: u32) -> OwnedFd {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(
        fd >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a descriptor socket(2) just returned, owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_ll is valid; the fields set are plain integers.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_ifindex = ifindex as i32;
    // SAFETY: `addr` is a sockaddr_ll of the size given, alive for the call.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of_val(&addr) as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "binding the packet socket: {}",
        std::io::Error::last_os_error()
    );
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads an int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_QDISC_BYPASS,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of_val(&one) as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "PACKET_QDISC_BYPASS: {}",
        std::io::Error::last_os_error()
    );
    sock
}

/// Sends `frames` with one `sendmmsg`; how many left (0 when the veth's ring is full:
/// the kernel says ENOBUFS, and the next batch tries again).
fn send(sock: &OwnedFd, frames: &mut [Vec<u8>]) -> u64 {
    let mut iovs: Vec<libc::iovec> = frames
        .iter_mut()
        .map(|f| libc::iovec {
            iov_base: f.as_mut_ptr().cast(),
            iov_len: f.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty message.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: `msgs` point at `iovs` and `frames`, which outlive the call.
    let rc = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
    u64::try_from(rc).unwrap_or(0)
}
