//! Ports a host process listens on (`/proc/net/{tcp,udp}{,6}` of the daemon's network
//! namespace): a route given such a port is served for its clients (the XDP program
//! takes their packets first), but the host's own connections to the gateway address
//! and port never leave the host's stack: they reach that process, or are refused,
//! never a backend. `berth get routes` says so per route, and a change is logged.

use std::{collections::BTreeMap, net::IpAddr};

use crate::datapath::Protocol;

/// Host listeners by protocol and port: the local addresses they listen on.
pub type Listeners = BTreeMap<(Protocol, u16), Vec<IpAddr>>;

/// The host's listening TCP sockets and bound, unconnected UDP sockets (`None` if none
/// of the tables can be read).
pub fn read() -> Option<Listeners> {
    let mut out = Listeners::new();
    let mut any = false;
    for (file, protocol, listening) in [
        ("/proc/net/tcp", Protocol::Tcp, "0A"),
        ("/proc/net/tcp6", Protocol::Tcp, "0A"),
        ("/proc/net/udp", Protocol::Udp, "07"),
        ("/proc/net/udp6", Protocol::Udp, "07"),
    ] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        any = true;
        for (ip, port) in parse(&text, listening) {
            let addrs = out.entry((protocol, port)).or_default();
            if !addrs.contains(&ip) {
                addrs.push(ip);
            }
        }
    }
    any.then_some(out)
}

/// The local (address, port) of the sockets of one `/proc/net` table in state
/// `listening` (hex: `0A` TCP LISTEN, `07` UDP unconnected).
pub fn parse(text: &str, listening: &str) -> Vec<(IpAddr, u16)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            if state != listening {
                return None;
            }
            let (addr, port) = local.split_once(':')?;
            Some((address(addr)?, u16::from_str_radix(port, 16).ok()?))
        })
        .collect()
}

/// An address as `/proc/net` writes it: the bytes of each 32-bit word in host order.
fn address(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// What a route served on `addr`/`protocol`/`port` should say about a host listener
/// there, if one listens on that port on the address or on every address.
pub fn conflict(
    listeners: &Listeners,
    protocol: Protocol,
    addr: IpAddr,
    port: u16,
) -> Option<String> {
    let addrs = listeners.get(&(protocol, port))?;
    let on = addrs.iter().find(|a| a.is_unspecified() || **a == addr)?;
    Some(format!(
        "a host process listens on {protocol} {}:{port}: clients are served, but the \
         host's own connections to {addr}:{port} reach that process, not a backend",
        match on {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7535 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0200FB0A:C350 0100FB0A:7530 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn listening_sockets_are_read_with_their_address_and_port_and_others_skipped() {
        let got = parse(TCP, "0A");
        assert_eq!(
            got,
            vec![
                ("0.0.0.0".parse().unwrap(), 30005),
                ("127.0.0.1".parse().unwrap(), 8080)
            ]
        );
        let v6 = "  sl  local_address                         remote_address                        st\n\
                  0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A\n";
        assert_eq!(parse(v6, "0A"), vec![("::1".parse().unwrap(), 8080)]);
    }

    #[test]
    fn a_listener_on_every_address_or_the_gateways_is_a_conflict_others_not() {
        let gw: IpAddr = "10.251.0.100".parse().unwrap();
        let mut l = Listeners::new();
        l.insert((Protocol::Tcp, 30005), vec!["0.0.0.0".parse().unwrap()]);
        l.insert((Protocol::Tcp, 30006), vec!["127.0.0.1".parse().unwrap()]);
        let said = conflict(&l, Protocol::Tcp, gw, 30005).expect("a conflict");
        assert!(said.contains("TCP 0.0.0.0:30005"), "{said}");
        assert_eq!(conflict(&l, Protocol::Tcp, gw, 30006), None);
        assert_eq!(conflict(&l, Protocol::Udp, gw, 30005), None);
    }
}
