//! Leader election with a `coordination.k8s.io/v1` Lease: one daemon (the allocator)
//! writes claims and status, every daemon programs its own datapath.
//!
//! As in client-go, expiry is judged on the local clock: a holder's lease is taken over
//! once its record (holder, renew time) has not changed for the lease duration, so
//! clock skew between nodes does not matter. Leadership is a deadline: a leader may
//! write until `renew_deadline` after its last successful renewal was sent, which is
//! shorter than the lease duration, so two writers never overlap. A failed renewal
//! (someone else holds the lease) ends leadership at once.
//!
//! Correctness of allocation does not depend on the election (claim names are the
//! lock); the election only keeps the number of writers at one.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{api::PostParams, Api, Client};
use tokio::sync::Notify;

/// Name of the Lease the allocators compete for.
pub const LEASE_NAME: &str = "berth-allocator";

/// Election timing and identity.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease (the daemon's own).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// Who we are (the node name).
    pub identity: String,
    /// `leaseDurationSeconds`: how long others wait before taking over.
    pub duration: Duration,
    /// How long after a renewal was sent we may still write (< `duration`).
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: LEASE_NAME.to_string(),
            identity: identity.to_string(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// Whether this daemon may write now; shared by the elector and every writer.
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    until: Arc<Mutex<Option<Instant>>>,
}

/// A write was refused because this daemon does not hold the lease.
#[derive(Debug, thiserror::Error)]
#[error("not the leader: {what} not written")]
pub struct NotLeader {
    /// What was not written.
    pub what: String,
}

impl Leadership {
    /// Leadership that never ends (tests of writers, single-node setups).
    pub fn always() -> Self {
        let l = Leadership::default();
        l.set(Some(Instant::now() + Duration::from_secs(1 << 30)));
        l
    }

    /// Whether we hold the lease now.
    pub fn is_leader(&self) -> bool {
        let until = *self.until.lock().unwrap_or_else(|e| e.into_inner());
        until.is_some_and(|d| Instant::now() < d)
    }

    /// `Ok` if we may write `what` now.
    pub fn ensure(&self, what: impl FnOnce() -> String) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader { what: what() })
        }
    }

    fn set(&self, until: Option<Instant>) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }
}

/// Errors of one election step.
pub type LeaseError = Box<super::ApiError>;

/// Competes for the lease and keeps `Leadership` current.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    leadership: Leadership,
    /// The other holder's record as last seen, and when it was first seen so.
    observed: Option<((String, Option<String>), Instant)>,
}

impl Elector {
    /// An elector for `config`, updating `leadership`.
    pub fn new(client: Client, config: LeaseConfig, leadership: Leadership) -> Self {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            leadership,
            observed: None,
        }
    }

    fn error(&self, action: &'static str) -> impl FnOnce(kube::Error) -> LeaseError {
        super::ApiError::about(action, "Lease", &self.config.namespace, &self.config.name)
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew; returns whether we lead afterwards. A lost race
    /// or another live holder ends leadership at once; an API failure leaves it to run
    /// out at its deadline.
    pub async fn step(&mut self) -> Result<bool, LeaseError> {
        let sent = Instant::now();
        let now = Timestamp::now();
        let current = self.read().await?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(self.lead(sent)),
                Err(e) if super::api_code(&e) == Some(409) => Ok(self.follow()),
                Err(e) => Err(self.error("creating")(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        let next = if holder == self.config.identity {
            self.spec(now, spec.acquire_time.clone(), transitions)
        } else {
            let record = (
                holder.clone(),
                spec.renew_time.as_ref().map(|t| t.0.to_string()),
            );
            let seen = match &self.observed {
                Some((r, at)) if *r == record => *at,
                _ => {
                    self.observed = Some((record, Instant::now()));
                    Instant::now()
                }
            };
            let duration = spec
                .lease_duration_seconds
                .map_or(self.config.duration, |s| {
                    Duration::from_secs(s.max(0) as u64)
                });
            if !holder.is_empty() && seen.elapsed() < duration {
                return Ok(self.follow());
            }
            tracing::info!(previous = holder, "taking over the allocator lease");
            self.spec(now, None, transitions + 1)
        };
        lease.spec = Some(next);
        // A conflict: someone else renewed or took it between our read and write.
        match self.write(&lease, "renewing").await? {
            true => Ok(self.lead(sent)),
            false => Ok(self.follow()),
        }
    }

    async fn read(&self) -> Result<Option<Lease>, LeaseError> {
        self.api
            .get_opt(&self.config.name)
            .await
            .map_err(self.error("reading"))
    }

    /// Replaces the lease at the version read; `false` on a conflict.
    async fn write(&self, lease: &Lease, action: &'static str) -> Result<bool, LeaseError> {
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if super::api_code(&e) == Some(409) => Ok(false),
            Err(e) => Err(self.error(action)(e)),
        }
    }

    fn lead(&mut self, sent: Instant) -> bool {
        self.observed = None;
        self.leadership.set(Some(sent + self.config.renew_deadline));
        true
    }

    fn follow(&mut self) -> bool {
        self.leadership.set(None);
        false
    }

    /// Gives the lease back if we hold it, so that another daemon takes over at once
    /// rather than after the lease duration (client-go's release on cancel). Leadership
    /// ends first, whatever the API says.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        self.leadership.set(None);
        let current = self.read().await?;
        let Some(mut lease) = current else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        // A conflict means someone else wrote it: it is not ours to give back.
        self.write(&lease, "releasing").await.map(drop)
    }

    /// Steps every `retry` until `stop`, then releases the lease; wakes `changed` when
    /// leadership starts or ends.
    pub async fn run(mut self, changed: Arc<Notify>, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut was = false;
        loop {
            if let Err(e) = self.step().await {
                tracing::warn!(error = %crate::error_chain(&e), "allocator lease");
            }
            let is = self.leadership.is_leader();
            if is != was {
                tracing::info!(leader = is, "allocator lease changed hands");
                changed.notify_one();
                was = is;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry) => {}
                _ = &mut stop => break,
            }
        }
        match self.release().await {
            Ok(()) => tracing::info!("allocator lease released"),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "releasing the allocator lease")
            }
        }
    }
}
