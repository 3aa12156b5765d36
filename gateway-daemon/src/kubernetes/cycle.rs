//! Kubernetes mode's side of `reconcile::reconcile_once`: PortClaims through the API as
//! the claim store (the leader writes, a follower only reads), and the API as the
//! status sink (GatewayClass, Gateway, policy and route statuses, with their events).

use std::{collections::BTreeSet, sync::Arc, time::SystemTime};

use futures::{stream, StreamExt as _};

use super::{
    claims::{self, ClaimError, Recent},
    events, repair,
    sources::{Held, View},
    status::{self, StatusError},
    Writer, STATUS_CONCURRENCY,
};
use crate::{
    model::{PortClaim, RouteKey, RouteKind, CONTROLLER_NAME},
    planner::Plan,
    reconcile::{ClaimStore, Committed, Read, StatusSink},
};

/// PortClaims as the reflector holds them, overlaid with this daemon's own recent
/// writes; the leader's plans also see the ports the repair pass offers back.
pub(super) struct ApiClaims<'c> {
    writer: &'c Writer,
    recent: &'c mut Recent,
    view: &'c View,
    hints: Vec<PortClaim>,
    /// The claims the last read planned over (without hints), for the commit.
    held: Held,
}

impl<'c> ApiClaims<'c> {
    /// The claims of `view` as `writer` commits them, remembering its writes in `recent`.
    pub(super) fn new(writer: &'c Writer, recent: &'c mut Recent, view: &'c View) -> Self {
        ApiClaims {
            writer,
            recent,
            view,
            hints: repair::hints(view),
            held: Held::default(),
        }
    }
}

impl ClaimStore for ApiClaims<'_> {
    type Error = ClaimError;

    async fn read(&mut self) -> Result<Read, ClaimError> {
        let mut held = self.view.held.clone();
        self.recent.overlay(&mut held);
        let leader = self.writer.leadership.is_leader();
        let mut claims = held.list();
        if leader {
            // Ports the repair pass offers back are proposals only the leader makes.
            claims.extend(
                self.hints
                    .iter()
                    .filter(|h| !held.claims.contains_key(&claim_key(h)))
                    .map(|h| Arc::new(h.clone())),
            );
        }
        self.held = held;
        Ok(Read {
            claims,
            allocate: leader,
        })
    }

    async fn commit(&mut self, _: Read, plan: &Plan) -> Result<Committed, ClaimError> {
        let Writer {
            client,
            versions,
            leadership,
            recorder,
        } = self.writer;
        let mut done = Vec::new();
        let result = claims::commit(
            client,
            leadership,
            &self.held,
            &plan.claims,
            self.recent,
            &mut done,
        )
        .await;
        // What was committed before a race or an error is told all the same.
        for n in events::from_changes(&done) {
            events::publish(recorder, versions, &n).await;
        }
        match result {
            Ok(()) => Ok(Committed::Done),
            Err(ClaimError::Raced { namespace, name }) => {
                Ok(Committed::Raced(format!("{namespace}/{name}")))
            }
            Err(ClaimError::NotLeader(e)) => Ok(Committed::NotWriter(e.to_string())),
            Err(e) => Err(e),
        }
    }
}

fn claim_key(c: &PortClaim) -> super::sources::Key {
    (c.metadata.ns().to_string(), c.metadata.name.to_string())
}

/// Statuses through the API.
pub(super) struct ApiStatuses<'c> {
    pub(super) writer: &'c Writer,
    pub(super) view: &'c View,
    pub(super) now: SystemTime,
}

impl StatusSink for ApiStatuses<'_> {
    type Error = StatusError;

    /// GatewayClass and Gateway statuses, then policy and route statuses (several
    /// routes at once); every status is tried, the first error is returned.
    async fn write(&mut self, plan: &Plan) -> Result<(), StatusError> {
        let Writer {
            client, leadership, ..
        } = self.writer;
        let view = self.view;
        let mut first_error = None;
        let now_text = humantime::format_rfc3339_seconds(self.now).to_string();
        let ours = view
            .snapshot
            .gateway_classes
            .iter()
            .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
            .filter_map(|c| view.classes.get(c.metadata.name.as_str()));
        for class in ours {
            let r = status::apply_gateway_class(client, leadership, class, &now_text);
            keep_first(&mut first_error, r.await)?;
        }
        for g in &plan.gateways {
            let current = view.gateways.get(&(g.namespace.clone(), g.name.clone()));
            let r = status::apply_gateway(client, leadership, g, current.map(|o| &**o));
            keep_first(&mut first_error, r.await)?;
        }
        for p in &plan.policies {
            let key = (p.kind, p.namespace.to_string(), p.name.to_string());
            let current = view.policies.get(&key);
            let r = status::apply_policy(client, leadership, p, current.map(|o| &**o));
            keep_first(&mut first_error, r.await)?;
        }
        self.write_routes(plan, &mut first_error).await?;
        first_error.map_or(Ok(()), Err)
    }
}

impl ApiStatuses<'_> {
    /// Every route of the plan, and every route that still shows entries of ours
    /// (emptied of them); events for the conditions that changed.
    async fn write_routes(
        &self,
        plan: &Plan,
        first_error: &mut Option<StatusError>,
    ) -> Result<(), StatusError> {
        let Writer {
            client,
            versions,
            leadership,
            recorder,
        } = self.writer;
        let view = self.view;
        let mut targets: Vec<(RouteKind, String, String, Vec<_>)> = plan
            .routes
            .iter()
            .map(|r| {
                (
                    r.kind,
                    r.namespace.to_string(),
                    r.name.to_string(),
                    r.status.parents.clone(),
                )
            })
            .collect();
        let planned: BTreeSet<_> = targets
            .iter()
            .map(|(k, ns, n, _)| (*k, ns.clone(), n.clone()))
            .collect();
        for (key, obj) in &view.routes {
            let shows_ours = obj
                .data
                .pointer("/status/parents")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|ps| {
                    ps.iter().any(|p| {
                        p.get("controllerName").and_then(serde_json::Value::as_str)
                            == Some(CONTROLLER_NAME)
                    })
                });
            if shows_ours && !planned.contains(key) {
                targets.push((key.0, key.1.clone(), key.2.clone(), Vec::new()));
            }
        }
        let writes = targets.into_iter().map(|(kind, ns, name, ours)| {
            let resource = versions.route(kind);
            let cached = view.routes.get(&(kind, ns.clone(), name.clone())).cloned();
            async move {
                let result = status::write_route(
                    client,
                    leadership,
                    &resource,
                    &ns,
                    &name,
                    &ours,
                    cached.as_deref(),
                )
                .await;
                (kind, ns, name, cached, result)
            }
        });
        let mut results = stream::iter(writes).buffer_unordered(STATUS_CONCURRENCY);
        while let Some((kind, ns, name, cached, result)) = results.next().await {
            let Some(Some(merged)) = keep_first(first_error, result)? else {
                continue;
            };
            let uid = cached.and_then(|o| o.metadata.uid.clone());
            let route = RouteKey {
                kind,
                namespace: ns.as_str().into(),
                name: name.as_str().into(),
            };
            for n in events::from_status(route, uid.map(Into::into), &merged) {
                events::publish(recorder, versions, &n).await;
            }
        }
        Ok(())
    }
}

/// Passes a status write's result on, except that a failure other than lost
/// leadership is logged and kept (the first one) so that the other writes go on.
fn keep_first<T>(
    first: &mut Option<StatusError>,
    result: Result<T, StatusError>,
) -> Result<Option<T>, StatusError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e @ StatusError::NotLeader(_)) => Err(e),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "status not written");
            first.get_or_insert(e);
            Ok(None)
        }
    }
}
