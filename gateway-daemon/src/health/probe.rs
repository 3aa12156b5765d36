//! The checks themselves, from the gateway's own stack (the source address the
//! kernel picks toward the backend: the node's address on the way to it, as a SNAT
//! flow's; a router-mode backend answers it the same way). Each within its timeout.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UdpSocket},
};

use super::checks::CheckKind;

/// Runs `kind` against `endpoint` within `timeout`: `Ok` if it passed, else why not.
/// (The checker thread runs TCP checks many at once, in `tcp`.)
pub async fn run(kind: &CheckKind, endpoint: SocketAddr, timeout: Duration) -> Result<(), String> {
    let attempt = match kind {
        CheckKind::Tcp => return super::tcp::once(endpoint, timeout).await,
        CheckKind::Udp { send, expect } => {
            futures::future::Either::Left(udp(endpoint, send, expect))
        }
        CheckKind::Http { path, statuses } => {
            futures::future::Either::Right(http(endpoint, path, statuses))
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(no_answer(timeout)),
    }
}

/// Why a check not answered within `timeout` failed.
pub fn no_answer(timeout: Duration) -> String {
    format!("no answer within {}", humantime::format_duration(timeout))
}

/// Closes a check's connection with an RST: no FIN exchange, and no socket left in
/// TIME_WAIT on the gateway (10,000 endpoints checked every 5 s would keep 120,000).
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
}

/// Sends `send`, waits for an answer beginning with `expect` (a refused port answers
/// with an ICMP error, seen as a failed receive).
async fn udp(endpoint: SocketAddr, send: &[u8], expect: &[u8]) -> Result<(), String> {
    let any: SocketAddr = if endpoint.is_ipv4() {
        "0.0.0.0:0".parse().map_err(|_| "address")?
    } else {
        "[::]:0".parse().map_err(|_| "address")?
    };
    let sock = UdpSocket::bind(any)
        .await
        .map_err(|e| format!("bind: {e}"))?;
    sock.connect(endpoint)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    sock.send(send).await.map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; 2048];
    let n = sock
        .recv(&mut buf)
        .await
        .map_err(|e| format!("receive: {e}"))?;
    if buf[..n].starts_with(expect) {
        Ok(())
    } else {
        Err(format!(
            "an answer of {n} bytes not beginning with the expected bytes"
        ))
    }
}

/// `GET path`: the status line's code must be in `statuses` (200-399 when empty).
async fn http(endpoint: SocketAddr, path: &str, statuses: &[u16]) -> Result<(), String> {
    let mut s = TcpStream::connect(endpoint)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {endpoint}\r\nUser-Agent: berth-health-check\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    // The status line is all that is read.
    let mut head = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 1024 {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("receive: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    reset(s);
    let line = String::from_utf8_lossy(&head);
    let code: u16 = line
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("HTTP/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "no HTTP status line in the answer".to_string())?;
    let passes = if statuses.is_empty() {
        (200..400).contains(&code)
    } else {
        statuses.contains(&code)
    };
    if passes {
        Ok(())
    } else {
        Err(format!("HTTP status {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn tcp_http_and_udp_checks_pass_on_live_servers_and_fail_on_dead_ports() {
        block_on(async {
            let timeout = Duration::from_secs(1);
            // An HTTP server answering 503, on loopback.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let web = listener.local_addr().expect("addr");
            tokio::spawn(async move {
                while let Ok((mut c, _)) = listener.accept().await {
                    let mut buf = [0u8; 512];
                    let _ = c.read(&mut buf).await;
                    let _ = c
                        .write_all(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n")
                        .await;
                }
            });
            let udp = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
            let echo = udp.local_addr().expect("addr");
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                    let _ = udp.send_to(&buf[..n], from).await;
                }
            });
            let dead = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                l.local_addr().expect("addr")
            };
            assert_eq!(run(&CheckKind::Tcp, web, timeout).await, Ok(()));
            assert!(run(&CheckKind::Tcp, dead, timeout).await.is_err());
            let http = |statuses: Vec<u16>| CheckKind::Http {
                path: "/healthz".into(),
                statuses,
            };
            assert_eq!(run(&http(vec![503]), web, timeout).await, Ok(()));
            assert_eq!(
                run(&http(vec![]), web, timeout).await,
                Err("HTTP status 503".into())
            );
            let ask = |expect: &[u8]| CheckKind::Udp {
                send: b"ping".to_vec(),
                expect: expect.to_vec(),
            };
            assert_eq!(run(&ask(b"pi"), echo, timeout).await, Ok(()));
            assert!(run(&ask(b"pong"), echo, timeout).await.is_err());
            assert!(run(&ask(b""), dead, timeout).await.is_err(), "refused");
        });
    }
}
