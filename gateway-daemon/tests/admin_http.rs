//! The admin endpoint as clients that are slow, idle, huge or wrong meet it, against a
//! real `berth run` (no datapath, no root): one stalled client must not stop the
//! others, a huge header must not grow the daemon, methods other than GET and HEAD are
//! refused, `/metrics` is valid exposition text, and `berth get` cannot hang.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

mod run;
use run::{wait_for, Daemon, TempDir};

fn temp_dir(tag: &str) -> TempDir {
    TempDir::new(&format!("admin-{tag}"))
}

/// The examples' Gateway and two teams' routes, in a manifest directory of `tag`.
fn manifests(tag: &str) -> TempDir {
    let dir = temp_dir(&format!("{tag}-man"));
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        std::fs::copy(examples.join(f), dir.join(f)).expect("copy example");
    }
    dir
}

/// A ready daemon on the example manifests, after its directories (bound in this order,
/// the daemon is dropped first).
fn daemon(tag: &str) -> ([TempDir; 2], Daemon) {
    let dirs = [manifests(tag), temp_dir(&format!("{tag}-state"))];
    let d = Daemon::start(&dirs[0], &dirs[1]);
    (dirs, d)
}

/// One HTTP/1.x answer as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Header names in lower case.
    headers: BTreeMap<String, String>,
    body: String,
}

/// Reads one answer from `r`; its body by Content-Length, none if `head`.
fn read_answer(r: &mut impl BufRead, head: bool) -> Answer {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"));
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break;
        };
        headers.insert(name.to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = match head {
        true => 0,
        false => headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0),
    };
    let mut body = vec![0; length];
    r.read_exact(&mut body).expect("body");
    Answer {
        status,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    }
}

/// Sends `request` on a new connection and reads one answer.
fn ask(addr: &str, request: &str) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(request.as_bytes()).expect("send");
    read_answer(&mut BufReader::new(s), request.starts_with("HEAD "))
}

/// The daemon's resident memory in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    run::status_kib(pid, "VmRSS")
}

/// A client that opens a connection and sends a header byte every 200 ms, never
/// finishing, and opens another when the server closes it; until dropped.
struct Slowloris(Arc<AtomicBool>);

impl Slowloris {
    fn start(addr: &str) -> Slowloris {
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, stopped) = (addr.to_string(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(&addr) else {
                    return;
                };
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n");
                for byte in b"X-Slow: ".iter().chain([b'a'; 1000].iter()).cycle() {
                    if stopped.load(Ordering::Relaxed) || s.write_all(&[*byte]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
        Slowloris(stop)
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Polls `get` until it answers, for up to 10 s; panics naming `what`.
fn answered_within_10s(
    what: &str,
    mut get: impl FnMut() -> Result<String, berth::admin::ClientError>,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match get() {
            Ok(_) => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "{what} not answered within 10 s: {e}"
            ),
        }
    }
}

#[test]
fn a_slowloris_client_and_200_idle_connections_do_not_block_other_requests_and_are_closed() {
    let (_dirs, d) = daemon("slow");
    let _slow = Slowloris::start(&d.admin);
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(&d.admin).expect("idle connection"))
        .collect();
    answered_within_10s("/healthz", || berth::admin::get(&d.admin, "/healthz"));
    answered_within_10s("/api/v1/routes", || {
        berth::admin::get(&d.admin, "/api/v1/routes")
    });
    // The server closes idle connections itself, so that they free their slots: a
    // read sees the end of the stream (or a reset), not its own timeout.
    for mut s in idle {
        // Less than the connection lifetime (30 s): the idle timeout must do it.
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let read = s.read(&mut [0; 16]);
        assert!(
            matches!(&read, Ok(0))
                || read
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "an idle connection was not closed by the server: {read:?}"
        );
    }
}

#[test]
fn a_1_mib_header_gets_431_and_the_daemon_does_not_keep_the_memory() {
    let (_dirs, d) = daemon("huge");
    let before = vm_rss_kib(d.child.id());
    let mut s = TcpStream::connect(&d.admin).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let header = format!("X-Huge: {}\r\n", "a".repeat(1 << 20));
    let request = format!("GET /healthz HTTP/1.1\r\nHost: localhost\r\n{header}\r\n");
    // The server may answer and close before it has read everything: then the send
    // fails, which is as good as a 431.
    let sent = s.write_all(request.as_bytes());
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 431") || (sent.is_err() && answer.is_empty()),
        "a 1 MiB header got {:?} (send: {sent:?})",
        answer.lines().next()
    );
    let after = vm_rss_kib(d.child.id());
    assert!(
        after < before + 64 * 1024,
        "VmRSS grew from {before} KiB to {after} KiB"
    );
    // And the daemon still answers.
    assert_eq!(ask(&d.admin, "GET /healthz HTTP/1.0\r\n\r\n").status, 200);
}

#[test]
fn only_get_and_head_are_served_on_kept_alive_connections_and_unknown_paths_are_404() {
    let (_dirs, d) = daemon("methods");
    let post = ask(
        &d.admin,
        "POST /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    );
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(
        post.headers.get("allow").map(String::as_str),
        Some("GET, HEAD")
    );
    let put = ask(
        &d.admin,
        "PUT /api/v1/state HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(put.status, 405, "{put:?}");

    // HEAD: the status and headers of GET, no body (the connection then closes, so
    // anything after the head would be read here).
    let mut s = TcpStream::connect(&d.admin).expect("connect");
    s.write_all(b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{text:?}");
    assert_eq!(body, "", "HEAD got a body");

    // Two requests on one connection, both answered.
    let s = TcpStream::connect(&d.admin).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    for (path, want) in [("/healthz", "ok\n"), ("/readyz", "ready\n")] {
        write!(&s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("send");
        let a = read_answer(&mut r, false);
        assert_eq!(
            (a.status, a.body.as_str()),
            (200, want),
            "{path} on a kept-alive connection: {a:?}"
        );
    }

    let unknown = ask(&d.admin, "GET /nothing HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(unknown.status, 404, "{unknown:?}");
    let with_body = ask(
        &d.admin,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(with_body.status, 413, "{with_body:?}");
}

#[test]
fn a_request_to_another_host_name_is_refused_against_dns_rebinding() {
    let (_dirs, d) = daemon("host");
    let port = d.admin.rsplit_once(':').expect("a port").1.to_string();
    // A page at evil.example whose name was re-pointed at 127.0.0.1.
    for request in [
        "GET /api/v1/state HTTP/1.1\r\nHost: evil.example\r\n\r\n".to_string(),
        format!("GET /api/v1/routes HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n"),
        "GET http://evil.example/api/v1/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_string(),
        "POST /api/v1/drain HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 0\r\n\r\n"
            .to_string(),
    ] {
        let a = ask(&d.admin, &request);
        assert_eq!(a.status, 421, "{request:?}: {a:?}");
        assert!(
            a.body.contains("\"evil.example") && a.body.contains("DNS rebinding"),
            "{a:?}"
        );
    }
    assert!(
        d.readyz().is_some_and(|(ok, _)| ok),
        "the drain was refused"
    );
    // Addresses and localhost, with or without the port, and no Host (HTTP/1.0).
    for host in [
        "127.0.0.1".to_string(),
        d.admin.clone(),
        "localhost".to_string(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let a = ask(
            &d.admin,
            &format!("GET /api/v1/state HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(a.status, 200, "Host: {host}: {a:?}");
    }
    assert_eq!(
        ask(&d.admin, "GET /api/v1/state HTTP/1.0\r\n\r\n").status,
        200
    );
}

/// The problems of `text` as Prometheus text exposition (0.0.4): every sample's family
/// has one TYPE, before its samples, which are together; a counter's samples end in
/// `_total`; label values use only the escapes `\\`, `\"` and `\n`; values are numbers.
fn exposition_errors(text: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if types.insert(name.into(), kind.into()).is_some() {
                errors.push(format!("line {n}: a second TYPE of {name}"));
            }
            if let Some(c) = current.replace(name.into()) {
                done.insert(c);
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            match label_set_end(labels) {
                Ok(end) => rest = &labels[end..],
                Err(e) => {
                    errors.push(format!("line {n}: {e}: {line}"));
                    continue;
                }
            }
        }
        if rest.trim().parse::<f64>().is_err() {
            errors.push(format!("line {n}: value {rest:?} is not a number"));
        }
        match types.get(name) {
            None => errors.push(format!("line {n}: {name} has no TYPE")),
            Some(kind) if kind == "counter" && !name.ends_with("_total") => {
                errors.push(format!("line {n}: counter {name} does not end in _total"))
            }
            Some(_) if done.contains(name) || current.as_deref() != Some(name) => {
                errors.push(format!("line {n}: {name}'s samples are not together"))
            }
            Some(_) => {}
        }
    }
    errors
}

/// Where `name="value",...}` ends (just after the `}`), or what is wrong with it.
fn label_set_end(text: &str) -> Result<usize, String> {
    let mut chars = text.char_indices();
    loop {
        // A label name, `=`, a quoted value, then `,` or `}`.
        let mut name = String::new();
        for (_, c) in chars.by_ref() {
            match c {
                '=' => break,
                c if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                c => return Err(format!("{c:?} in a label name")),
            }
        }
        if name.is_empty() || chars.next().map(|(_, c)| c) != Some('"') {
            return Err("a label is not name=\"value\"".into());
        }
        loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\' | '"' | 'n')) => {}
                    other => return Err(format!("escape \\{other:?} in label {name}")),
                },
                Some((_, '"')) => break,
                Some((_, '\n')) | None => return Err(format!("label {name} is not closed")),
                Some(_) => {}
            }
        }
        match chars.next() {
            Some((_, ',')) => {}
            Some((i, '}')) => return Ok(i + 1),
            other => return Err(format!("{other:?} after label {name}")),
        }
    }
}

#[test]
fn metrics_are_valid_exposition_text() {
    let (_dirs, d) = daemon("metrics");
    let text = berth::admin::get(&d.admin, "/metrics").expect("/metrics");
    let errors = exposition_errors(&text);
    assert!(errors.is_empty(), "{}\n\n{text}", errors.join("\n"));
    assert!(
        text.lines().any(|l| l.starts_with("berth_listener_ports{")),
        "no labelled sample was checked:\n{text}"
    );
    // The checker itself catches what it is for.
    for (bad, want) in [
        ("berth_x 1\n", "has no TYPE"),
        ("# TYPE c counter\nc 1\n", "does not end in _total"),
        ("# TYPE g gauge\ng{a=\"x\ny\"} 1\n", "is not closed"),
        ("# TYPE g gauge\ng{a=\"x\\ty\"} 1\n", "escape"),
        (
            "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\n",
            "samples are not together",
        ),
    ] {
        let errors = exposition_errors(bad);
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{bad:?}: {errors:?}"
        );
    }
}

#[test]
fn the_metrics_address_serves_health_and_metrics_but_not_the_state_api() {
    let free = || {
        let l = TcpListener::bind("127.0.0.1:0").expect("free port");
        l.local_addr().expect("addr").to_string()
    };
    let (admin, metrics) = (free(), free());
    let dirs = [manifests("split"), temp_dir("split-state")];
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["run", "--manifests"])
        .arg(&dirs[0])
        .arg("--state-dir")
        .arg(&dirs[1])
        .args(["--admin-addr", &admin, "--metrics-addr", &metrics])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start berth run");
    let d = Daemon { child, admin };
    wait_for("readiness", || d.readyz().is_some_and(|(ok, _)| ok));
    for path in ["/healthz", "/readyz", "/metrics"] {
        let a = ask(&metrics, &format!("GET {path} HTTP/1.0\r\n\r\n"));
        assert_eq!(a.status, 200, "{path} on --metrics-addr: {a:?}");
    }
    for path in ["/api/v1/state", "/api/v1/routes", "/api/v1/routes/team-a"] {
        let a = ask(&metrics, &format!("GET {path} HTTP/1.0\r\n\r\n"));
        assert_eq!(a.status, 404, "{path} on --metrics-addr: {a:?}");
        assert!(
            berth::admin::get(&d.admin, path).is_ok(),
            "{path} on --admin-addr"
        );
    }
}

/// A listener whose connections are accepted and answered by `answer` (which gets the
/// stream), each on its own thread.
fn fake_daemon(answer: fn(TcpStream)) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || answer(s));
        }
    });
    addr
}

#[test]
fn berth_get_gives_up_on_a_daemon_that_never_finishes_its_answer() {
    let silent = fake_daemon(|s| {
        // Holds the connection, says nothing, until the client leaves.
        let _ = (&s).read_to_end(&mut Vec::new());
    });
    let trickling = fake_daemon(|mut s| {
        // A byte of a never-ending head every 200 ms: each read gets something.
        for byte in b"HTTP/1.0 200 OK\r\n".iter().chain([b'x'; 1 << 16].iter()) {
            if s.write_all(&[*byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    for addr in [silent, trickling] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["get", "routes", "--admin-addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("berth get");
        // Not a timing bound: a generous deadline for "does not hang".
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("berth get against {addr} still waits after 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("read stderr");
        assert!(!status.success(), "berth get against {addr} succeeded");
        assert!(
            err.contains(&addr) && err.contains("no complete answer within"),
            "the error does not name {addr} and the timeout: {err}"
        );
    }
}
