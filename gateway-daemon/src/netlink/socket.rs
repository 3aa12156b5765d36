//! A request socket: sends a request, reads the answer's messages, turns
//! NLMSG_ERROR and NLMSG_DONE into outcomes.

use super::*;

/// The port id of the kernel, the only sender whose datagrams are read.
pub(super) const KERNEL: u32 = 0;

/// A blocking netlink socket for requests, with a receive timeout so a silent kernel
/// cannot hang the caller.
pub(super) struct Socket {
    pub(super) fd: OwnedFd,
    pub(super) seq: u32,
    pub(super) buf: Vec<u8>,
}

/// One message of an answer: its type and what follows the netlink header.
pub(super) struct Reply {
    pub(super) ty: u16,
    pub(super) body: Vec<u8>,
}

impl Socket {
    pub(super) fn open(protocol: libc::c_int) -> Result<Self, NetlinkError> {
        const WHAT: &str = "opening a netlink socket";
        let io = |source| NetlinkError::Io { what: WHAT, source };
        let fd = sys::socket(protocol, false).map_err(io)?;
        sys::bind(fd.as_fd()).map_err(io)?;
        let timeout = libc::timeval {
            tv_sec: REQUEST_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        sys::set_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, timeout).map_err(io)?;
        // Errors then carry the kernel's explanation and not a copy of the request. Both
        // are conveniences: kernels without them still answer.
        let _ = sys::set_option(fd.as_fd(), libc::SOL_NETLINK, libc::NETLINK_EXT_ACK, 1i32);
        let _ = sys::set_option(fd.as_fd(), libc::SOL_NETLINK, libc::NETLINK_CAP_ACK, 1i32);
        Ok(Socket {
            fd,
            seq: 0,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Sends a request and returns the messages answering it, up to the kernel's ack.
    pub(super) fn request(
        &mut self,
        what: &'static str,
        request: &Request,
    ) -> Result<Vec<Reply>, NetlinkError> {
        self.exchange(what, request).map(|(replies, _)| replies)
    }

    /// Sends a dump request and returns every message up to NLMSG_DONE, starting over
    /// when the kernel says that changes interrupted the dump.
    pub(super) fn dump(
        &mut self,
        what: &'static str,
        request: &Request,
    ) -> Result<Vec<Reply>, NetlinkError> {
        for _ in 0..DUMP_ATTEMPTS {
            let (replies, interrupted) = self.exchange(what, request)?;
            if !interrupted {
                return Ok(replies);
            }
        }
        Err(NetlinkError::Interrupted { what })
    }

    /// Sends `request` and collects the answer; true if a dump was interrupted.
    pub(super) fn exchange(
        &mut self,
        what: &'static str,
        request: &Request,
    ) -> Result<(Vec<Reply>, bool), NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        sys::send(self.fd.as_fd(), &request.finish(seq))
            .map_err(|source| NetlinkError::Io { what, source })?;
        let malformed = |detail| NetlinkError::Malformed { what, detail };
        let (mut replies, mut interrupted) = (Vec::new(), false);
        loop {
            let len = self.receive(what)?;
            for message in Messages::new(&self.buf[..len]) {
                let message = message.map_err(malformed)?;
                // A late answer to an earlier request on this socket.
                if message.seq != seq {
                    continue;
                }
                interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
                match message.ty {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR | NLMSG_DONE => {
                        let status = Status::parse(&message).map_err(malformed)?;
                        if status.errno < 0 {
                            return Err(NetlinkError::Kernel {
                                what,
                                errno: status.errno.saturating_neg(),
                                message: status.message,
                            });
                        }
                        return Ok((replies, interrupted));
                    }
                    NLMSG_OVERRUN => return Err(malformed("overrun")),
                    ty => replies.push(Reply {
                        ty,
                        body: message.body.to_vec(),
                    }),
                }
            }
        }
    }

    /// Receives one datagram from the kernel into `self.buf`; returns its length.
    pub(super) fn receive(&mut self, what: &'static str) -> Result<usize, NetlinkError> {
        loop {
            let (len, sender) = sys::recv(self.fd.as_fd(), &mut self.buf, false).map_err(|e| {
                let source = if e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(io::ErrorKind::TimedOut, "the kernel did not answer")
                } else {
                    e
                };
                NetlinkError::Io { what, source }
            })?;
            // Another process may send to this port; only the kernel answers requests.
            if sender != KERNEL {
                continue;
            }
            if len > self.buf.len() {
                return Err(NetlinkError::Malformed {
                    what,
                    detail: "datagram larger than the receive buffer",
                });
            }
            return Ok(len);
        }
    }
}

/// The outcome carried by NLMSG_ERROR (0 is an ack) or NLMSG_DONE.
pub(super) struct Status {
    pub(super) errno: i32,
    pub(super) message: Option<String>,
}

impl Status {
    pub(super) fn parse(message: &Message<'_>) -> Result<Self, &'static str> {
        let body = message.body;
        // Kernels before 4.x could end a dump with an empty NLMSG_DONE.
        if message.ty == NLMSG_DONE && body.is_empty() {
            return Ok(Status {
                errno: 0,
                message: None,
            });
        }
        let errno = ne_i32(body.get(..4).ok_or("short status")?).ok_or("short status")?;
        let mut tlvs = &body[4..];
        if message.ty == NLMSG_ERROR {
            // The request follows: its header only when capped, else all of it.
            let echoed = tlvs.get(..NLMSG_HDRLEN).ok_or("short error")?;
            let echoed_len = ne_u32(&echoed[..4]).ok_or("short error")? as usize;
            let skip = if message.flags & NLM_F_CAPPED != 0 {
                NLMSG_HDRLEN
            } else {
                align(echoed_len)
            };
            tlvs = tlvs.get(skip..).unwrap_or_default();
        }
        let message = if message.flags & NLM_F_ACK_TLVS != 0 {
            ext_ack_message(tlvs)
        } else {
            None
        };
        Ok(Status { errno, message })
    }
}

/// The kernel's error text among extended-ack attributes; a garbled one is dropped, as
/// it only decorates the error.
pub(super) fn ext_ack_message(tlvs: &[u8]) -> Option<String> {
    Attrs::new(tlvs)
        .map_while(Result::ok)
        .find(|a| a.ty == NLMSGERR_ATTR_MSG)
        .map(|a| String::from_utf8_lossy(until_nul(a.value)).into_owned())
}
