//! Parsing and name checks, without a kernel.

use super::*;

#[test]
fn attributes_are_read_with_padding_and_nesting() {
    let request = Request::new(RTM_NEWLINK, 0)
        .fixed(&ifinfomsg(7, 0, 0))
        .attr(IFLA_IFNAME, b"abc\0")
        .nested(IFLA_LINKINFO, |r| r.attr(IFLA_INFO_KIND, b"dummy\0"));
    let datagram = request.finish(1);
    let message = Messages::new(&datagram).next().unwrap().unwrap();
    let link = Link::parse(message.body).unwrap();
    assert_eq!(link.index, 7);
    assert_eq!(link.name, b"abc");
    assert_eq!(link.kind.as_deref(), Some(&b"dummy"[..]));
}

#[test]
fn an_attribute_longer_than_its_buffer_is_rejected() {
    let mut buf = Vec::new();
    buf.extend_from_slice(&9u16.to_ne_bytes());
    buf.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    buf.extend_from_slice(b"ab");
    assert!(Attrs::new(&buf).next().unwrap().is_err());
}

#[test]
fn a_message_shorter_than_its_header_is_rejected() {
    let mut buf = 8u32.to_ne_bytes().to_vec();
    buf.resize(NLMSG_HDRLEN, 0);
    assert!(Messages::new(&buf).next().unwrap().is_err());
}

#[test]
fn a_capped_error_yields_errno_and_kernel_message() {
    let mut body = (-libc::EEXIST).to_ne_bytes().to_vec();
    body.extend_from_slice(&Request::new(RTM_NEWADDR, 0).finish(3)[..NLMSG_HDRLEN]);
    let tlv = Request::new(0, 0).attr(NLMSGERR_ATTR_MSG, b"exists\0");
    body.extend_from_slice(&tlv.buf[NLMSG_HDRLEN..]);
    let message = Message {
        ty: NLMSG_ERROR,
        flags: NLM_F_CAPPED | NLM_F_ACK_TLVS,
        seq: 3,
        body: &body,
    };
    let status = Status::parse(&message).unwrap();
    assert_eq!(status.errno, -libc::EEXIST);
    assert_eq!(status.message.as_deref(), Some("exists"));
}

#[test]
fn interface_names_follow_the_kernel_rules() {
    for good in ["berth0", "a", "x-y_z.1", "fifteen_chars_x"] {
        assert!(check_name(good).is_ok(), "{good}");
    }
    for bad in ["", ".", "..", "a/b", "a:b", "a b", "sixteen_chars_xx"] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
}
