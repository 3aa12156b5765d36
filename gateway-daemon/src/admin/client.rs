//! The client of the admin endpoint: [`get`] for `berth get`, [`post`] for `berth
//! drain` and `berth undrain`.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

/// How long [`get`] waits for a whole answer: connecting, asking, reading to the end.
pub const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// A GET against a running daemon's admin endpoint; returns the body of a 200 answer.
/// A daemon that hangs, or answers a byte at a time, must not hang its caller (`berth
/// get`, probes, tests): the whole request has [`GET_TIMEOUT`]. Errors name the URL.
pub fn get(addr: &str, path: &str) -> std::io::Result<String> {
    call("GET", addr, path)
}

/// A POST without a body (`berth drain`, `berth undrain`); returns the body of a 2xx
/// answer, within [`GET_TIMEOUT`] as [`get`].
pub fn post(addr: &str, path: &str) -> std::io::Result<String> {
    call("POST", addr, path)
}

/// `method path` against the admin endpoint at `addr`: the body of a 2xx answer (200
/// for GET); a 404 is an error of kind `NotFound`.
fn call(method: &str, addr: &str, path: &str) -> std::io::Result<String> {
    let url = format!("http://{addr}{path}");
    let named = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{method} {url}: no complete answer within {GET_TIMEOUT:?}"),
        ),
        kind => std::io::Error::new(kind, format!("{method} {url}: {e}")),
    };
    let (head, body) = fetch(addr, method, path, Instant::now() + GET_TIMEOUT).map_err(named)?;
    let status = head.lines().next().unwrap_or_default();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    let ok = match method {
        "GET" => code == "200",
        _ => code.len() == 3 && code.starts_with('2'),
    };
    if !ok {
        // A path the daemon does not serve is told apart by its kind (an older daemon
        // without a newer endpoint).
        let kind = match code {
            "404" => std::io::ErrorKind::NotFound,
            _ => std::io::ErrorKind::Other,
        };
        return Err(std::io::Error::new(
            kind,
            format!("{method} {url}: {status}: {}", body.trim()),
        ));
    }
    Ok(body)
}

/// The head and body of the answer to `method path`, read to its end before
/// `deadline`.
fn fetch(
    addr: &str,
    method: &str,
    path: &str,
    deadline: Instant,
) -> std::io::Result<(String, String)> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(std::io::ErrorKind::TimedOut)
    };
    let target = std::net::ToSocketAddrs::to_socket_addrs(addr)?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let mut s = TcpStream::connect_timeout(&target, left()?)?;
    s.set_write_timeout(Some(left()?))?;
    // HTTP/1.0: the daemon closes the connection after its answer, which ends it.
    let length = if method == "GET" {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{length}\r\n"
    )?;
    let mut text = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    loop {
        // Each read may take only what is left of the whole request's time.
        s.set_read_timeout(Some(left()?))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = String::from_utf8(text).map_err(std::io::Error::other)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    Ok((head.to_string(), body.to_string()))
}
