//! TCP checks, many at once on the checker thread, each without a task, a timer or a
//! registration of the runtime's own (issue 30's CPU budget: 10,000 endpoints every
//! 5 s). A check is a nonblocking socket set to close with an RST (`SO_LINGER` 0, set
//! before it connects: closed in any state it sends no FIN and leaves no TIME_WAIT),
//! its connect, and one `epoll_ctl` adding it to the checks' own epoll (itself
//! registered once with the runtime); closing it takes it out. Its outcome is the
//! kernel's: writable and no error is a connection made; an error or a hang-up is
//! `SO_ERROR`'s error (none: made, as a stream's connect says). A check not answered
//! within its timeout fails, with the words of the other checks' timeouts. So it costs
//! four system calls (socket, setsockopt, connect, epoll_ctl) and close, where a tokio
//! `TcpStream` in a task under `tokio::time::timeout` made eight and woke the runtime
//! once more per check.

use std::{
    io,
    net::SocketAddr,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use mio::{unix::SourceFd, Events, Interest, Poll, Token};
use socket2::{Domain, Socket, Type};
use tokio::io::unix::AsyncFd;

/// The TCP checks in flight, each with what its caller keeps with it (`T`).
pub(super) struct Checks<T> {
    /// The epoll of their sockets, readable in the runtime when one of them has news.
    poll: AsyncFd<Poll>,
    events: Events,
    /// In flight, by the index of their token; `free` are the empty ones.
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
}

struct Slot<T> {
    /// Counts the checks the slot held: an event of an earlier one (a socket outliving
    /// its close in a forked child) is not taken for the current one's.
    generation: usize,
    check: Option<InFlight<T>>,
}

struct InFlight<T> {
    socket: Socket,
    started: Instant,
    timeout: Duration,
    with: T,
}

/// A check finished: what its caller gave, its result, and how long it took.
pub(super) struct Done<T> {
    pub with: T,
    pub result: Result<(), String>,
    pub took: Duration,
}

/// Events taken from the epoll at once: as many as the checks in flight at most (one
/// each), so that one `epoll_wait` takes them all.
const EVENTS: usize = super::MAX_IN_FLIGHT;

/// A token is a slot's index (its low bits; there are `MAX_IN_FLIGHT` slots) and its
/// generation.
const INDEX_BITS: u32 = 16;
const INDEX_MASK: usize = (1 << INDEX_BITS) - 1;

impl<T> Checks<T> {
    /// No checks yet; to be made within a tokio runtime with IO.
    pub fn new() -> io::Result<Self> {
        Ok(Checks {
            poll: crate::sys::poll::register_epoll(Poll::new()?)?,
            events: Events::with_capacity(EVENTS),
            slots: Vec::new(),
            free: Vec::new(),
        })
    }

    /// Whether no check is in flight.
    pub fn idle(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    /// Starts a check of `endpoint`, failing if not answered within `timeout`; it is
    /// done at once when it fails (or passes) before any answer.
    pub fn start(&mut self, endpoint: SocketAddr, timeout: Duration, with: T) -> Option<Done<T>> {
        let started = Instant::now();
        let done = |with, result| {
            Some(Done {
                with,
                result,
                took: started.elapsed(),
            })
        };
        let socket = match connect(endpoint) {
            Ok(Some(socket)) => socket,
            // Connected at once; closing it resets it.
            Ok(None) => return done(with, Ok(())),
            Err(e) => return done(with, Err(format!("connect: {e}"))),
        };
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot {
                generation: 0,
                check: None,
            });
            self.slots.len() - 1
        });
        let slot = &mut self.slots[index];
        slot.generation = (slot.generation + 1) & (usize::MAX >> INDEX_BITS);
        let token = Token(slot.generation << INDEX_BITS | index);
        let fd = socket.as_raw_fd();
        if let Err(e) =
            self.poll
                .get_ref()
                .registry()
                .register(&mut SourceFd(&fd), token, Interest::WRITABLE)
        {
            self.free.push(index);
            return done(with, Err(format!("connect: {e}")));
        }
        slot.check = Some(InFlight {
            socket,
            started,
            timeout,
            with,
        });
        None
    }

    /// Waits until a check in flight may have news (`finish` then takes it).
    pub async fn ready(&self) -> io::Result<()> {
        let mut guard = self.poll.readable().await?;
        // Cleared before `finish` reads the epoll: what comes after is a new edge.
        guard.clear_ready();
        Ok(())
    }

    /// Adds to `done` the checks answered and those not answered in time at `now`;
    /// says when the next in flight times out.
    pub fn finish(&mut self, now: Instant, done: &mut Vec<Done<T>>) -> Option<Instant> {
        if self.idle() {
            return None;
        }
        loop {
            match self
                .poll
                .get_mut()
                .poll(&mut self.events, Some(Duration::ZERO))
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Not seen (an epoll read without waiting, of a valid buffer);
                    // the checks in flight then time out.
                    tracing::error!(error = %e, "health checks: epoll_wait");
                    break;
                }
            }
            let mut taken = 0;
            for event in &self.events {
                taken += 1;
                let Token(token) = event.token();
                let (index, generation) = (token & INDEX_MASK, token >> INDEX_BITS);
                let Some(slot) = self.slots.get_mut(index) else {
                    continue;
                };
                if slot.generation != generation || slot.check.is_none() {
                    continue;
                }
                let result = if event.is_error() || event.is_write_closed() {
                    match slot.check.as_ref().map(|c| c.socket.take_error()) {
                        Some(Ok(None)) | None => Ok(()),
                        Some(Ok(Some(e)) | Err(e)) => Err(format!("connect: {e}")),
                    }
                } else if event.is_writable() {
                    Ok(())
                } else {
                    continue;
                };
                if let Some(c) = slot.check.take() {
                    self.free.push(index);
                    let took = c.started.elapsed();
                    // Closing the socket resets the connection (SO_LINGER 0) and takes
                    // it out of the epoll.
                    drop(c.socket);
                    done.push(Done {
                        with: c.with,
                        result,
                        took,
                    });
                }
            }
            // Fewer than it could take: all taken.
            if taken < EVENTS {
                break;
            }
        }
        let mut next: Option<Instant> = None;
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let Some(c) = &slot.check else {
                continue;
            };
            // (A timeout past the end of time is none.)
            let Some(deadline) = c.started.checked_add(c.timeout) else {
                continue;
            };
            if deadline > now {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
                continue;
            }
            if let Some(c) = slot.check.take() {
                self.free.push(index);
                drop(c.socket);
                done.push(Done {
                    with: c.with,
                    result: Err(super::probe::no_answer(c.timeout)),
                    took: c.started.elapsed(),
                });
            }
        }
        next
    }
}

/// A nonblocking socket closing with an RST, connecting to `endpoint`; `None` if it
/// connected at once.
fn connect(endpoint: SocketAddr) -> io::Result<Option<Socket>> {
    let socket = Socket::new(
        Domain::for_address(endpoint),
        Type::STREAM.nonblocking(),
        None,
    )?;
    socket.set_linger(Some(Duration::ZERO))?;
    match socket.connect(&endpoint.into()) {
        Ok(()) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(Some(socket)),
        Err(e) => Err(e),
    }
}

/// One check of `endpoint` (the checker runs many at once on its `Checks`).
pub(super) async fn once(endpoint: SocketAddr, timeout: Duration) -> Result<(), String> {
    let mut checks = Checks::new().map_err(|e| format!("connect: {e}"))?;
    if let Some(d) = checks.start(endpoint, timeout, ()) {
        return d.result;
    }
    let mut done = Vec::with_capacity(1);
    loop {
        let next = checks.finish(Instant::now(), &mut done);
        if let Some(d) = done.pop() {
            return d.result;
        }
        let Some(next) = next else {
            return Err("connect: no check in flight".into());
        };
        tokio::select! {
            r = checks.ready() => r.map_err(|e| format!("connect: {e}"))?,
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_at_once_pass_fail_and_time_out_each_with_its_own() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let live = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                let live = live.local_addr().expect("addr");
                let dead = {
                    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                    l.local_addr().expect("addr")
                };
                // A listener whose accept queue is full drops the SYNs: no answer.
                let full = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
                full.bind(&"127.0.0.1:0".parse::<SocketAddr>().expect("addr").into())
                    .expect("bind");
                full.listen(0).expect("listen");
                let silent = full.local_addr().expect("addr").as_socket().expect("inet");
                let _queued = std::net::TcpStream::connect(silent).expect("connect");
                let mut checks = Checks::new().expect("epoll");
                let mut done = Vec::new();
                let timeout = Duration::from_millis(300);
                for (i, at) in [live, dead, silent, live].into_iter().enumerate() {
                    done.extend(checks.start(at, timeout, i));
                }
                let give_up = Instant::now() + Duration::from_secs(5);
                while done.len() < 4 && Instant::now() < give_up {
                    let next = checks.finish(Instant::now(), &mut done);
                    if let Some(next) = next {
                        tokio::select! {
                            r = checks.ready() => r.expect("ready"),
                            () = tokio::time::sleep_until(next.into()) => {}
                        }
                    }
                }
                assert!(checks.idle());
                done.sort_by_key(|d| d.with);
                let results: Vec<_> = done.iter().map(|d| d.result.clone()).collect();
                assert_eq!(
                    results,
                    [
                        Ok(()),
                        Err(format!(
                            "connect: {}",
                            io::Error::from_raw_os_error(libc::ECONNREFUSED)
                        )),
                        Err("no answer within 300ms".to_string()),
                        Ok(()),
                    ]
                );
                assert!(done[2].took >= timeout);
            });
    }
}
