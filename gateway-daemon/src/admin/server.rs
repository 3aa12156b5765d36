//! The admin endpoint's HTTP/1.1 server (hyper). It once was a hand-written responder
//! on one thread, one connection at a time: one slowloris client, or ~130 idle
//! connections, blocked every endpoint (and the DaemonSet's liveness probe would have
//! restarted the pod), a 512 MB header grew the daemon to 1.34 GB, and any method got
//! 200. Here every connection has its own task, headers have a size limit and a read
//! deadline, connections a lifetime and a cap, and requests a method and no body.
//!
//! The operator's requests (`POST /api/v1/drain`, `/api/v1/undrain`) are served on the
//! admin address only, and refused when they carry an `Origin` header: a web page the
//! operator's browser shows could otherwise drain the node with a cross-site POST to
//! 127.0.0.1 (such a POST needs no preflight).
//!
//! The admin address answers only requests whose `Host` is an IP literal, `localhost`
//! or its own configured host ([`AllowedHosts`]): others get 421, so that a page whose
//! name was re-pointed at 127.0.0.1 (DNS rebinding) reads nothing. The metrics address
//! (`--metrics-addr`, monitoring only, meant to be scraped by name) answers any.

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::{Either, Full};
use hyper::{
    body::{Body, Bytes, Frame, Incoming},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};

use super::{host::AllowedHosts, metrics::Detail, Endpoints, Resource, RouteRowParts, RowFormat};
use crate::{announce::Control, publish::Shared};

/// The most a request's line and headers may take: more gets 431 and the connection
/// closed, and no buffer grows past it.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// How long a client has to send a request's line and headers, and how long a
/// kept-alive connection waits for its next request: a client that sends a byte at a
/// time, or nothing, is cut off.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one connection is served, its requests and the writing of their answers:
/// then it is closed after the answer in flight, or [`HEADER_TIMEOUT`] later if that
/// answer is still not written (a client that reads slowly or not at all).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once on one listener, at most: more are closed as they come.
/// Fewer if the open-file limit is low (see [`connection_cap`]).
pub const MAX_CONNECTIONS: usize = 1024;

/// Serves each listener with its endpoints from a thread and runtime of its own, so
/// that answers never wait for a plan (in standalone mode the loop plans on the main
/// thread; in Kubernetes mode on the runtime's only thread). `admin_addr` is the
/// configured admin address, whose host the admin listener answers besides IP
/// literals and `localhost`.
pub fn spawn(
    listeners: Vec<(std::net::TcpListener, Endpoints)>,
    admin_addr: &str,
    detail: Detail,
    shared: Shared,
    control: Arc<Control>,
) -> std::io::Result<()> {
    let admin_hosts = AllowedHosts::new(admin_addr);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listeners = {
        let _in_runtime = runtime.enter();
        listeners
            .into_iter()
            .map(|(l, endpoints)| {
                l.set_nonblocking(true)?;
                Ok((TcpListener::from_std(l)?, endpoints))
            })
            .collect::<std::io::Result<Vec<_>>>()?
    };
    std::thread::Builder::new()
        .name("berth-admin".into())
        .spawn(move || {
            let servers = listeners.into_iter().map(|(l, endpoints)| {
                let hosts = (endpoints == Endpoints::All).then(|| admin_hosts.clone());
                let serving = Serving {
                    endpoints,
                    hosts,
                    detail,
                };
                serve(l, serving, shared.clone(), control.clone())
            });
            runtime.block_on(futures::future::join_all(servers));
        })?;
    Ok(())
}

/// What one listener serves, and to whom.
#[derive(Clone, Debug)]
pub struct Serving {
    /// Which endpoints.
    pub endpoints: Endpoints,
    /// Only requests to these hosts (none: any host).
    pub hosts: Option<AllowedHosts>,
    /// How much `/metrics` says per route.
    pub detail: Detail,
}

/// An answer this big leaves megabytes freed on the server's thread once written.
const BIG_ANSWER: usize = 1 << 20;

/// Serves `listener` for ever: each connection on a task of its own, HTTP/1.1 with
/// keep-alive (and HTTP/1.0), within the limits above; with `hosts`, only requests
/// to those hosts.
pub async fn serve(listener: TcpListener, serving: Serving, shared: Shared, control: Arc<Control>) {
    let Serving {
        endpoints,
        hosts,
        detail,
    } = serving;
    let slots_cap = connection_cap();
    let slots = Arc::new(Semaphore::new(slots_cap));
    // Connections refused since the last warning, and when that was.
    let (mut refused, mut warned) = (0u64, None);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_HEADER_BYTES);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: wait for some to close.
                tracing::warn!(error = %e, "admin endpoint: accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Dropping the stream closes it; said at most once a minute, with a count.
            refused += 1;
            if warned.is_none_or(|t: std::time::Instant| t.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(
                    refused,
                    cap = slots_cap,
                    "admin endpoint: connections refused, every slot is taken (idle clients are cut off after {}s)",
                    HEADER_TIMEOUT.as_secs()
                );
                warned = Some(std::time::Instant::now());
                refused = 0;
            }
            continue;
        };
        let (shared, control, hosts) = (shared.clone(), control.clone(), hosts.clone());
        let big = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answered_big = Arc::clone(&big);
        let service = service_fn(move |request: Request<Incoming>| {
            let response = match misdirected(&request, hosts.as_ref()) {
                Some(refused) => refused,
                None => respond(&request, endpoints, detail, &shared, &control),
            };
            if response.body().size_hint().exact().unwrap_or(0) >= BIG_ANSWER as u64 {
                answered_big.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            if tokio::time::timeout(CONNECTION_TIMEOUT, connection.as_mut())
                .await
                .is_err()
            {
                connection.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(HEADER_TIMEOUT, connection).await;
            }
            // A big answer built whole (the state document of 100k routes) left its
            // pages freed but held by this thread's heap: give them back (every task of
            // the server runs on this one thread). The routes' rows are sent in parts.
            if big.load(std::sync::atomic::Ordering::Relaxed) {
                crate::memory::release_freed();
            }
        });
    }
}

/// 421 for a request to a host the listener does not answer (see the module's doc):
/// the `Host` header's, and an absolute URI's authority, must both be allowed.
fn misdirected(
    request: &Request<Incoming>,
    hosts: Option<&AllowedHosts>,
) -> Option<Response<Answer>> {
    let hosts = hosts?;
    // A header that is not text is no host this endpoint has.
    let header = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("?"));
    let authority = request.uri().authority().map(|a| a.as_str());
    let refused = [header, authority]
        .into_iter()
        .flatten()
        .find(|h| !hosts.allows(Some(h)))?;
    Some(response(
        StatusCode::MISDIRECTED_REQUEST,
        "text/plain",
        format!(
            "host {refused:?} is not served here: the admin endpoint answers requests to an \
             IP address, localhost or its --admin-addr host only (protection against DNS \
             rebinding)\n"
        ),
    ))
}

/// The answer to one request: 404 for a path this listener does not serve, 405 for a
/// method the resource does not answer (GET and HEAD, or POST for the operator's
/// requests; hyper sends HEAD's headers without the body), 413 for a request with a
/// body, 403 for an operator's request from a web page, 202 with the request's number
/// for one handed to the loop, else the resource.
fn respond(
    request: &Request<Incoming>,
    endpoints: Endpoints,
    detail: Detail,
    shared: &Shared,
    control: &Control,
) -> Response<Answer> {
    let Some(resource) = Resource::at(request.uri().path(), endpoints) else {
        return response(StatusCode::NOT_FOUND, "text/plain", "not found\n");
    };
    let allowed = match resource {
        Resource::Request(_) => *request.method() == Method::POST,
        _ => matches!(*request.method(), Method::GET | Method::HEAD),
    };
    if !allowed {
        let methods = resource.methods();
        let mut r = response(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            format!("method not allowed: {}\n", methods.replace(", ", " or ")),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(methods));
        return r;
    }
    if !request.body().is_end_stream() {
        return response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "text/plain",
            "requests with a body are not accepted\n",
        );
    }
    if let Resource::Request(what) = resource {
        if request.headers().contains_key(header::ORIGIN) {
            return response(
                StatusCode::FORBIDDEN,
                "text/plain",
                "requests from web pages (with an Origin header) are refused: use berth \
                 drain / berth undrain, or curl -X POST\n",
            );
        }
        let number = control.request(what);
        return response(
            StatusCode::ACCEPTED,
            "application/json",
            format!("{{\"request\": {number}}}\n"),
        );
    }
    let published = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
    // The routes' rows are written as they are sent.
    let rows = match &resource {
        Resource::Routes(ns) => Some((ns, RowFormat::Json, "application/json")),
        Resource::RouteTable(ns) => Some((ns, RowFormat::Table, "text/plain; charset=utf-8")),
        _ => None,
    };
    if let Some((namespace, format, content_type)) = rows {
        let parts = RouteRowParts::new(published, namespace.as_deref(), format);
        return with_type(Response::new(Either::Right(Parts(parts))), content_type);
    }
    let (status, content_type, body) = resource.answer(&published, detail);
    response(status, content_type, body)
}

/// An answer's body: whole, or written a part at a time as it is sent.
type Answer = Either<Full<Bytes>, Parts>;

/// The routes' rows (`/api/v1/routes`, `/api/v1/tables/routes`), written a part at a
/// time while hyper sends them: ~30 MiB at 100k routes never in memory at once.
struct Parts(RouteRowParts);

impl Body for Parts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        // Each part is made here, on the server's own thread (a part of 64 KiB takes
        // well under a millisecond).
        let part = self.get_mut().0.next_part();
        std::task::Poll::Ready(part.map(|p| Ok(Frame::data(Bytes::from(p)))))
    }
}

fn response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Answer> {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    with_type(r, content_type)
}

fn with_type(mut r: Response<Answer>, content_type: &'static str) -> Response<Answer> {
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// [`MAX_CONNECTIONS`], or a quarter of the open-file limit if that is less: the admin
/// endpoint's clients must not take the descriptors the claim store and the datapath
/// need (two listeners take at most half).
fn connection_cap() -> usize {
    match crate::sys::rlimit::open_files_soft_limit() {
        Ok(soft) => {
            let quarter = usize::try_from(soft / 4).unwrap_or(usize::MAX);
            MAX_CONNECTIONS.min(quarter.max(1))
        }
        Err(_) => MAX_CONNECTIONS,
    }
}
