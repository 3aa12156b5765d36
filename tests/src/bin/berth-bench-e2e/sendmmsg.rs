//! `--load sendmmsg`: this binary as `sendmmsg SECS CPU DST...` in the client namespace,
//! and the load generators a measurement starts.

use super::*;

/// Payloads per UDP GSO datagram (the client's veth, without segmentation offload, cuts
/// it into that many ordinary packets) and datagrams per `sendmmsg`.
pub(super) const SEGMENTS: usize = 16;
pub(super) const BATCH: usize = 4;
pub(super) const SOL_UDP: libc::c_int = 17;
pub(super) const UDP_SEGMENT: libc::c_int = 103;

/// Sends on `FLOWS` connected sockets (flows spread over the destinations) as fast as
/// it can for SECS seconds.
pub(super) fn sendmmsg_generator(args: &[String]) {
    let secs: f64 = args[0].parse().expect("seconds");
    let cpu: usize = args[1].parse().expect("cpu");
    let dsts: Vec<SocketAddrV4> = args[2..]
        .iter()
        .map(|a| a.parse().expect("destination ip:port"))
        .collect();
    pin(0, cpu);
    let socks: Vec<UdpSocket> = (0..FLOWS)
        .map(|i| {
            let s = UdpSocket::bind((CLIENT, FIRST_SOURCE_PORT + i)).expect("bind");
            s.connect(dsts[usize::from(i) % dsts.len()])
                .expect("connect");
            let size = PAYLOAD as libc::c_int;
            // SAFETY: setsockopt reads an int that outlives the call.
            let rc = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    SOL_UDP,
                    UDP_SEGMENT,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of_val(&size) as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
            s
        })
        .collect();
    let payload = [0x42u8; PAYLOAD * SEGMENTS];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
        .map(|_| {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty message.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        for s in &socks {
            // SAFETY: msgs point at iov and payload, which outlive the call. Errors
            // (an ICMP error before the path is ready) are ignored: keep sending.
            unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        }
    }
}

/// The running generator.
pub(super) enum Generator {
    Frames(FrameGenerator),
    Packets(berth_tests::loadgen::PacketGenerator),
    Sendmmsg(Proc),
}

impl Generator {
    /// Starts `load` of `flows` in `family` to `dsts` (one port; the frame generator
    /// spreads frames over their addresses).
    pub(super) fn start(
        load: Load,
        flows: FlowLoad,
        family: Family,
        topo: &Topology,
        dsts: &[SocketAddr],
    ) -> Self {
        match load {
            Load::Frames | Load::PacketSocket => {
                let source = SocketAddr::new(flows.source(family), flows.first_port());
                let macs = (mac(&topo.client, "eth0"), mac(&topo.gateway, "c0"));
                let template = Template::udp(source, dsts[0], macs, &[0x42; PAYLOAD]);
                let addrs: Vec<IpAddr> = dsts.iter().map(SocketAddr::ip).collect();
                let (client, flows) = (&topo.client, flows.flows());
                if load == Load::Frames {
                    Generator::Frames(FrameGenerator::start(
                        client, "eth0", &template, flows, &addrs, GEN_CPU,
                    ))
                } else {
                    Generator::Packets(berth_tests::loadgen::PacketGenerator::start(
                        client, "eth0", &template, flows, &addrs, GEN_CPU,
                    ))
                }
            }
            Load::Sendmmsg => {
                assert!(flows == FlowLoad::Long, "sendmmsg sends long flows only");
                assert!(family == Family::V4, "sendmmsg sends IPv4 only");
                let secs = (WARMUP + MEASURE + Duration::from_secs(20)).as_secs_f64();
                let child = topo
                    .client
                    .command(&std::env::current_exe().expect("own path"))
                    .arg("sendmmsg")
                    .arg(secs.to_string())
                    .arg(GEN_CPU.to_string())
                    .args(dsts.iter().map(ToString::to_string))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("starting the sendmmsg generator");
                Generator::Sendmmsg(Proc::from_child(child, "the sendmmsg generator"))
            }
        }
    }

    /// Packets sent so far.
    pub(super) fn sent(&self, client: &Netns) -> u64 {
        match self {
            Generator::Frames(g) => g.sent(),
            Generator::Packets(g) => g.sent(),
            Generator::Sendmmsg(_) => {
                let (packets, dropped) = tx_stats(client, "eth0");
                packets + dropped
            }
        }
    }

    pub(super) fn assert_running(&mut self) {
        match self {
            Generator::Frames(g) => g.assert_running(),
            Generator::Packets(g) => g.assert_running(),
            Generator::Sendmmsg(p) => p.assert_running(),
        }
    }
}
