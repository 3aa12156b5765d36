//! The client of the admin endpoint: [`get`] for `berth get`, [`post`] for `berth
//! drain` and `berth undrain`.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

/// How long [`get`] waits for a whole answer: connecting, asking, reading to the end.
pub const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call to the admin endpoint got no answer it takes. Each names the request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting, asking or reading failed.
    #[error("{request}: {cause}")]
    Io {
        /// `METHOD URL`.
        request: String,
        /// Cause.
        cause: std::io::Error,
    },
    /// No whole answer came within [`GET_TIMEOUT`].
    #[error("{request}: no complete answer within {GET_TIMEOUT:?}")]
    TimedOut {
        /// `METHOD URL`.
        request: String,
    },
    /// The daemon answered with another status (404: a path an older daemon does not
    /// serve; 503: not ready, the body says why).
    #[error("{request}: {status}: {body}")]
    Status {
        /// `METHOD URL`.
        request: String,
        /// The status code (0 if the status line had none).
        code: u16,
        /// The status line.
        status: String,
        /// The answer's body, trimmed.
        body: String,
    },
}

impl ClientError {
    /// The status code the daemon answered with, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The body of an answer with another status.
    pub fn body(&self) -> Option<&str> {
        match self {
            ClientError::Status { body, .. } => Some(body),
            _ => None,
        }
    }
}

/// A GET against a running daemon's admin endpoint; returns the body of a 200 answer.
/// A daemon that hangs, or answers a byte at a time, must not hang its caller (`berth
/// get`, probes, tests): the whole request has [`GET_TIMEOUT`]. Errors name the URL.
pub fn get(addr: &str, path: &str) -> Result<String, ClientError> {
    call("GET", addr, path)
}

/// A POST without a body (`berth drain`, `berth undrain`); returns the body of a 2xx
/// answer, within [`GET_TIMEOUT`] as [`get`].
pub fn post(addr: &str, path: &str) -> Result<String, ClientError> {
    call("POST", addr, path)
}

/// `method path` against the admin endpoint at `addr`: the body of a 2xx answer (200
/// for GET).
fn call(method: &str, addr: &str, path: &str) -> Result<String, ClientError> {
    let request = format!("{method} http://{addr}{path}");
    let (head, body) = match fetch(addr, method, path, Instant::now() + GET_TIMEOUT) {
        Ok(answer) => answer,
        Err(e) => {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    ClientError::TimedOut { request }
                }
                _ => ClientError::Io { request, cause: e },
            })
        }
    };
    let status = head.lines().next().unwrap_or_default();
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ok = match method {
        "GET" => code == 200,
        _ => (200..300).contains(&code),
    };
    if !ok {
        return Err(ClientError::Status {
            request,
            code,
            status: status.to_string(),
            body: body.trim().to_string(),
        });
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
