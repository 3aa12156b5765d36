//! The netlink wire format: building requests, walking the messages of a datagram
//! and the attributes of a message.

use super::*;

/// A request being built: the netlink header, a fixed header, attributes.
pub(super) struct Request {
    pub(super) buf: Vec<u8>,
}

impl Request {
    pub(super) fn new(ty: u16, flags: u16) -> Self {
        let mut buf = vec![0; NLMSG_HDRLEN];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        Request { buf }
    }

    /// Appends the family's fixed header (ifinfomsg, ifaddrmsg, genlmsghdr).
    pub(super) fn fixed(mut self, header: &[u8]) -> Self {
        self.buf.extend_from_slice(header);
        self.pad();
        self
    }

    pub(super) fn attr(mut self, ty: u16, value: &[u8]) -> Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLA_HDRLEN]);
        self.buf.extend_from_slice(value);
        self.close_attr(start, ty);
        self
    }

    pub(super) fn nested(mut self, ty: u16, inner: impl FnOnce(Self) -> Self) -> Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; NLA_HDRLEN]);
        self = inner(self);
        self.close_attr(start, ty | NLA_F_NESTED);
        self
    }

    pub(super) fn close_attr(&mut self, start: usize, ty: u16) {
        // Every attribute this module builds is a name or an address: far below 64 KiB.
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
        self.pad();
    }

    pub(super) fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }

    /// The finished message with its length and sequence number.
    pub(super) fn finish(&self, seq: u32) -> Vec<u8> {
        let mut buf = self.buf.clone();
        // Requests hold a few attributes: far below 4 GiB.
        let len = buf.len() as u32;
        buf[0..4].copy_from_slice(&len.to_ne_bytes());
        buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        buf
    }
}

pub(super) fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut m = [0; IFINFOMSG_LEN];
    // ifi_family AF_UNSPEC, ifi_type 0; ifi_index is a C int, and kernel indexes fit it.
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m[8..12].copy_from_slice(&flags.to_ne_bytes());
    m[12..16].copy_from_slice(&change.to_ne_bytes());
    m
}

/// An ifaddrmsg of `family` (`AF_INET`, `AF_INET6`; 0 for a dump of both), with
/// `IFA_F_*` `flags`.
pub(super) fn ifaddrmsg(family: i32, index: u32, prefix_len: u8, flags: u8) -> [u8; IFADDRMSG_LEN] {
    let mut m = [0; IFADDRMSG_LEN];
    m[0] = family as u8;
    m[1] = prefix_len;
    m[2] = flags;
    m[3] = RT_SCOPE_UNIVERSE;
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m
}

/// An rtmsg of `family` for a `dst_len`-bit prefix in `table` (a table above 255 is
/// `RT_TABLE_COMPAT` here and must travel in RTA_TABLE too), of routing `protocol`.
pub(super) fn rtmsg(
    family: i32,
    dst_len: u8,
    table: u32,
    protocol: u8,
    scope: u8,
    ty: u8,
) -> [u8; RTMSG_LEN] {
    let mut m = [0; RTMSG_LEN];
    m[0] = family as u8;
    m[1] = dst_len;
    // rtm_src_len, rtm_tos: 0.
    m[4] = u8::try_from(table).unwrap_or(RT_TABLE_COMPAT);
    m[5] = protocol;
    m[6] = scope;
    m[7] = ty;
    // rtm_flags: 0.
    m
}

pub(super) fn genl_header(cmd: u8, version: u8) -> [u8; GENL_HDRLEN] {
    [cmd, version, 0, 0]
}

/// A string attribute's value: the bytes and a NUL.
pub(super) fn c_string(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A netlink message inside a datagram.
pub(super) struct Message<'a> {
    pub(super) ty: u16,
    pub(super) flags: u16,
    pub(super) seq: u32,
    pub(super) body: &'a [u8],
}

/// The messages of a datagram; stops at the first malformed one.
pub(super) struct Messages<'a> {
    pub(super) rest: &'a [u8],
}

impl<'a> Messages<'a> {
    pub(super) fn new(datagram: &'a [u8]) -> Self {
        Messages { rest: datagram }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let header = self
                .rest
                .get(..NLMSG_HDRLEN)
                .ok_or("short netlink header")?;
            let len = ne_u32(&header[0..4]).ok_or("short netlink header")? as usize;
            if len < NLMSG_HDRLEN || len > self.rest.len() {
                return Err("netlink message length out of bounds");
            }
            let message = Message {
                ty: ne_u16(&header[4..6]).ok_or("short netlink header")?,
                flags: ne_u16(&header[6..8]).ok_or("short netlink header")?,
                seq: ne_u32(&header[8..12]).ok_or("short netlink header")?,
                body: &self.rest[NLMSG_HDRLEN..len],
            };
            Ok((message, align(len).min(self.rest.len())))
        })();
        match parsed {
            Ok((message, next)) => {
                self.rest = &self.rest[next..];
                Some(Ok(message))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// An attribute: its type without the nested/byte-order flags, and its value.
pub(super) struct Attr<'a> {
    pub(super) ty: u16,
    pub(super) value: &'a [u8],
}

/// The attributes in a buffer; stops at the first malformed one.
pub(super) struct Attrs<'a> {
    pub(super) rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Attrs { rest: buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let header = self
                .rest
                .get(..NLA_HDRLEN)
                .ok_or("short attribute header")?;
            let len = ne_u16(&header[0..2]).ok_or("short attribute header")? as usize;
            let ty = ne_u16(&header[2..4]).ok_or("short attribute header")?;
            if len < NLA_HDRLEN || len > self.rest.len() {
                return Err("attribute length out of bounds");
            }
            let attr = Attr {
                ty: ty & NLA_TYPE_MASK,
                value: &self.rest[NLA_HDRLEN..len],
            };
            // The last attribute may go without its padding.
            Ok((attr, align(len).min(self.rest.len())))
        })();
        match parsed {
            Ok((attr, next)) => {
                self.rest = &self.rest[next..];
                Some(Ok(attr))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Rounds up to NLA_ALIGNTO (and NLMSG_ALIGNTO): 4 bytes.
pub(super) fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// `(fixed header, rest)` if `body` holds at least the fixed header.
pub(super) fn split_fixed(body: &[u8], len: usize) -> Option<(&[u8], &[u8])> {
    let header = body.get(..len)?;
    Some((header, body.get(align(len)..).unwrap_or_default()))
}

pub(super) fn until_nul(value: &[u8]) -> &[u8] {
    value.split(|&b| b == 0).next().unwrap_or_default()
}

pub(super) fn ne_u16(b: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(b.try_into().ok()?))
}

pub(super) fn ne_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.try_into().ok()?))
}

pub(super) fn ne_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(b.try_into().ok()?))
}

pub(super) fn ne_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}
