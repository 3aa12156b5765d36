//! The loop of Kubernetes mode (`run`): reflectors, the election, debounced cycles of
//! `Controller::reconcile`, and the announce decision, until shutdown.

use std::collections::BTreeSet;

use super::*;

/// What `run` needs to know.
#[derive(Clone, Debug)]
pub struct Options {
    /// This daemon's identity in the election and in events (the node name).
    pub identity: String,
    /// Namespace of the election's Lease (the daemon's own).
    pub lease_namespace: String,
    /// Addresses of Gateways whose `spec.addresses` has no address Berth serves.
    pub default_addresses: planner::DefaultAddresses,
    /// The source ports SNAT flows may be given (`--snat-ports`).
    pub snat_ports: std::ops::RangeInclusive<u16>,
    /// The datapath's room for services and backends (`--max-services`,
    /// `--max-backends`).
    pub capacity: crate::datapath::Capacity,
}

/// Waits for a quiet spell after a watch event (at most `DEBOUNCE_MAX`).
async fn settle(changed: &Notify) {
    let deadline = Instant::now() + DEBOUNCE_MAX;
    loop {
        tokio::select! {
            _ = changed.notified() => if Instant::now() >= deadline { return },
            _ = tokio::time::sleep(QUIET) => return,
        }
    }
}

/// Runs Kubernetes mode until `shutdown`: reflectors, election, cycles, and the
/// announce decision (`announcer`, from the start: also while the reflectors list). A
/// failed cycle is logged and retried within a second; what was last written and
/// programmed stays. On shutdown the lease is given back (another node allocates at
/// once); the datapath is left as programmed.
pub async fn run(
    client: Client,
    options: Options,
    mut datapath: Option<Datapath>,
    shared: Shared,
    mut announcer: Announcer,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let versions = sources::discover(&client).await;
    tracing::info!(
        tcproute = versions.tcp_route,
        udproute = versions.udp_route,
        referencegrant = versions.reference_grant,
        "Gateway API versions"
    );
    let changed = Arc::new(Notify::new());
    let sources = Sources::start(&client, &versions, &changed);
    tokio::select! {
        _ = announce_until(sources.ready(), &mut datapath, &shared, &mut announcer) => {}
        _ = &mut shutdown => {
            tracing::info!("shutting down before every kind was listed");
            return;
        }
    }
    tracing::info!("every kind listed; planning");
    let leadership = Leadership::default();
    let elector = Elector::new(
        client.clone(),
        LeaseConfig::new(&options.lease_namespace, &options.identity),
        leadership.clone(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let elector = tokio::spawn(elector.run(changed.clone(), async {
        let _ = stopped.await;
    }));
    let controller = Controller::new(
        client,
        versions,
        leadership,
        &options.identity,
        options.default_addresses,
    )
    .with_snat_ports(options.snat_ports.clone())
    .with_capacity(options.capacity);
    tokio::select! {
        _ = cycles(controller, &sources, &changed, datapath, &shared, announcer) => {}
        _ = &mut shutdown => tracing::info!("shutting down"),
    }
    let _ = stop.send(());
    // The elector gives the lease back; do not wait on a dead API server for long.
    let _ = tokio::time::timeout(Duration::from_secs(5), elector).await;
}

/// Applies the announce decision (every second, and when asked) until `done`.
async fn announce_until(
    done: impl std::future::Future<Output = ()>,
    datapath: &mut Option<Datapath>,
    shared: &Shared,
    announcer: &mut Announcer,
) {
    let control = Arc::clone(announcer.control());
    tokio::pin!(done);
    loop {
        announcer.step(datapath.as_mut(), shared);
        tokio::select! {
            _ = &mut done => return,
            _ = control.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Whether a change is notified and not yet taken (the notification, taken to look,
/// is stored again for the loop).
fn change_pending(changed: &Notify) -> bool {
    use futures::FutureExt as _;
    let stored = changed.notified().now_or_never().is_some();
    if stored {
        changed.notify_one();
    }
    stored
}

/// Plans, writes and programs on every change, and applies the announce decision
/// after each wake-up (at least every second), forever.
async fn cycles(
    mut controller: Controller,
    sources: &Sources,
    changed: &Notify,
    mut datapath: Option<Datapath>,
    shared: &Shared,
    mut announcer: Announcer,
) {
    let control = Arc::clone(announcer.control());
    let mut health = crate::health::Checker::new({
        let control = Arc::clone(&control);
        move || control.wake_loop()
    });
    let mut reported = BTreeSet::new();
    let (mut plan_due, mut failing, mut cooling) = (true, false, false);
    // A read of the counters gives way to a change of the objects.
    let pending = || change_pending(changed);
    loop {
        if !plan_due {
            // Nothing the plan depends on moved: only the counters are due.
            if let Some(dp) = &mut datapath {
                publish::refresh_traffic(shared, dp, &pending);
            }
        } else {
            let mut view = View::new(sources.objects());
            // Health checks add to the endpoints' readiness: the plan sees the slices
            // as they make them (Berth never writes slices).
            health.follow(&view.snapshot);
            if let Some(checked) = health.overlay(&view.snapshot) {
                view.snapshot = checked;
            }
            for e in &view.errors {
                if !reported.contains(e) {
                    tracing::error!("{e} (the object is left out until it is fixed)");
                }
            }
            reported = view.errors.iter().cloned().collect();
            let prev = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
            let now = SystemTime::now();
            let started = std::time::Instant::now();
            let checked = health.policy_entries(&view.snapshot, now);
            let result = match controller.reconcile(&view, now, checked).await {
                Ok(plan) => {
                    publish::effects(plan, datapath.as_mut(), &prev).map_err(CycleError::from)
                }
                Err(e) => Err(e),
            };
            (failing, cooling) = match result {
                Ok(mut next) => {
                    if prev.last_error.is_some() {
                        tracing::info!("recovered");
                    }
                    next.broken = view.errors.clone();
                    next.health = health.handle();
                    next.cycle_millis += started.elapsed().as_millis() as u64;
                    let cooling = next.cooling;
                    crate::memory::published();
                    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
                    if let Some(dp) = &mut datapath {
                        publish::refresh_stale_traffic(shared, dp, &pending);
                    }
                    (false, cooling)
                }
                Err(e) => {
                    let message = crate::error_chain(&e);
                    if prev.last_error.as_deref() != Some(&message) {
                        tracing::error!(error = message, "cycle failed; retrying");
                    }
                    let mut p = Published::clone(&prev);
                    p.last_error = Some(message);
                    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
                    (true, prev.cooling)
                }
            };
        }
        announcer.step(datapath.as_mut(), shared);
        // Plan again on a change, and within a second while failing or while a port
        // cools down; otherwise wake when traffic counters are due (every second, which
        // is also the announce decision's tick), or when the operator asks.
        let wait = if failing || cooling {
            Duration::from_secs(1)
        } else {
            publish::TRAFFIC_REFRESH
        };
        plan_due = tokio::select! {
            _ = changed.notified() => {
                settle(changed).await;
                true
            }
            // The operator asked something, or an endpoint's health changed.
            _ = control.notified() => health.moved(),
            _ = tokio::time::sleep(wait) => failing || cooling,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_change_is_seen_and_left_for_the_loop() {
        let changed = Notify::new();
        assert!(!change_pending(&changed));
        changed.notify_one();
        assert!(change_pending(&changed));
        assert!(change_pending(&changed), "still there after a look");
        use futures::FutureExt as _;
        assert!(
            changed.notified().now_or_never().is_some(),
            "the loop takes it"
        );
        assert!(!change_pending(&changed));
    }
}
