//! What other threads ask of the loop that applies the announce decision: the
//! operator's drain and undrain (the admin endpoint's `POST /api/v1/drain`,
//! `/api/v1/undrain`) and the stopping signal (SIGTERM with `--drain-on-stop`), with a
//! wake-up so that the loop applies them at once rather than at its next tick.

use std::{
    os::{fd::AsFd as _, fd::BorrowedFd, unix::net::UnixDatagram},
    sync::Mutex,
    time::SystemTime,
};

/// An operator's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `berth drain`: withdraw the addresses, until undrained (persisted).
    Drain,
    /// `berth undrain`: announce them again.
    Undrain,
}

/// Shared between the loop (which takes requests) and those who make them.
#[derive(Debug)]
pub struct Control {
    inner: Mutex<Inner>,
    /// Wakes the Kubernetes loop (async).
    notify: tokio::sync::Notify,
    /// Wakes the standalone loop (it polls the receiving end with its directory
    /// watch); none if the socket pair could not be made (the loop then applies
    /// requests at its next tick, within a second).
    wake: Option<(UnixDatagram, UnixDatagram)>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The latest request not yet taken (a later one replaces an earlier one).
    pending: Option<Request>,
    /// Requests made since start; the latest one's number.
    requested: u64,
    /// When the stopping signal arrived.
    stopping: Option<SystemTime>,
}

/// What the loop takes from [`Control::take`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// The latest request, if one came since the last take.
    pub request: Option<Request>,
    /// The number of the latest request made (applied once this take is).
    pub requested: u64,
    /// When the stopping signal arrived, if it did.
    pub stopping: Option<SystemTime>,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            inner: Mutex::default(),
            notify: tokio::sync::Notify::new(),
            wake: UnixDatagram::pair()
                .and_then(|(tx, rx)| {
                    tx.set_nonblocking(true)?;
                    rx.set_nonblocking(true)?;
                    Ok((tx, rx))
                })
                .ok(),
        }
    }
}

impl Control {
    /// Hands `request` to the loop; returns its number (the loop's published
    /// `applied` reaches it once applied).
    pub fn request(&self, request: Request) -> u64 {
        let number = {
            let mut inner = self.lock();
            inner.pending = Some(request);
            inner.requested += 1;
            inner.requested
        };
        self.wake();
        number
    }

    /// The stopping signal arrived at `at` (the first one counts).
    pub fn stop(&self, at: SystemTime) {
        self.lock().stopping.get_or_insert(at);
        self.wake();
    }

    /// Whether the stopping signal arrived.
    pub fn stopping(&self) -> bool {
        self.lock().stopping.is_some()
    }

    /// Takes the pending request (and empties the wake-up socket).
    pub fn take(&self) -> Taken {
        if let Some((_, rx)) = &self.wake {
            let mut buf = [0u8; 64];
            while rx.recv(&mut buf).is_ok() {}
        }
        let mut inner = self.lock();
        Taken {
            request: inner.pending.take(),
            requested: inner.requested,
            stopping: inner.stopping,
        }
    }

    /// The descriptor that becomes readable when something is asked (for poll).
    pub fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        self.wake.as_ref().map(|(_, rx)| rx.as_fd())
    }

    /// Resolves when something is asked (or was since the last wait).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Wakes the loop (something it plans from changed: an endpoint's health).
    pub fn wake_loop(&self) {
        self.wake();
    }

    fn wake(&self) {
        // `notify_one` keeps a permit when no one waits, so a request made while the
        // loop is busy wakes its next wait.
        self.notify.notify_one();
        if let Some((tx, _)) = &self.wake {
            // A full socket already wakes the loop.
            let _ = tx.send(&[1]);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_request_wins_and_every_request_is_numbered() {
        let c = Control::default();
        assert_eq!(c.take(), Taken::default());
        assert_eq!(c.request(Request::Drain), 1);
        assert_eq!(c.request(Request::Undrain), 2);
        let taken = c.take();
        assert_eq!(
            (taken.request, taken.requested),
            (Some(Request::Undrain), 2)
        );
        assert_eq!(c.take().request, None, "taken once");
    }

    #[test]
    fn a_request_wakes_a_poller_until_it_is_taken() {
        let c = Control::default();
        let fd = c.wake_fd().expect("a socket pair");
        let ready = |fd| crate::sys::poll::poll([Some(fd), None], std::time::Duration::ZERO);
        assert_eq!(ready(fd).unwrap(), [false, false]);
        c.request(Request::Drain);
        assert_eq!(ready(c.wake_fd().unwrap()).unwrap(), [true, false]);
        c.take();
        assert_eq!(ready(c.wake_fd().unwrap()).unwrap(), [false, false]);
    }

    #[test]
    fn the_first_stopping_signal_counts() {
        let c = Control::default();
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5);
        c.stop(t);
        c.stop(t + std::time::Duration::from_secs(1));
        assert_eq!(c.take().stopping, Some(t));
        assert!(c.stopping());
    }
}
