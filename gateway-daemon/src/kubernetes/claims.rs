//! PortClaims through the API. The planner's claim changes become creates, status
//! replaces and deletes, each conditional: a create fails if the name (the port) is
//! taken, a replace or delete fails if the claim changed since it was read. A failed
//! condition is a race with another writer: the claim is read again and the caller
//! plans again, so two allocators can never hand out one port twice.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    Api, Client, ResourceExt as _,
};

use super::{
    api_code,
    lease::{Leadership, NotLeader},
    sources::{Held, Key, Stored},
    ApiError,
};
use crate::{
    model::{PortClaim, PortClaimResource},
    planner::changes::claim_writes,
};

/// A committed change, for events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A claim was created: its route got the port.
    Created(Arc<PortClaim>),
    /// A claim was released: its route let go of the port.
    Released(Arc<PortClaim>),
    /// A released claim's cool-down ended and it was deleted.
    Deleted(Arc<PortClaim>),
}

/// Errors of committing claims.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The claim changed since it was read (or its name was taken): plan again.
    #[error("PortClaim {namespace}/{name} changed since it was read; planning again")]
    Raced {
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        name: String,
    },
    /// We do not hold the lease.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The API call failed.
    #[error(transparent)]
    Api(#[from] Box<ApiError>),
    /// The API server returned a claim Berth cannot read.
    #[error("PortClaim {namespace}/{name} as returned by the API server: {message}")]
    Invalid {
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Claims this daemon wrote or read directly, until the reflector shows them too: the
/// next plan must see our own writes, not the reflector's older view.
#[derive(Debug, Default)]
pub struct Recent {
    entries: BTreeMap<Key, (Option<Stored>, Instant)>,
}

impl Recent {
    /// How long an entry may hide the reflector's view (if the reflector never shows
    /// our version, someone wrote after us; conditional writes catch that anyway).
    pub const TTL: Duration = Duration::from_secs(30);

    /// Lays recent writes over `held`, forgetting those the reflector has caught up with.
    pub fn overlay(&mut self, held: &mut Held) {
        self.entries.retain(|key, (value, at)| {
            let stored = held.claims.get(key);
            let caught_up = match (&*value, stored) {
                (Some((_, rv)), Some((_, srv))) => rv == srv,
                (None, None) => true,
                _ => false,
            };
            if caught_up || at.elapsed() > Self::TTL {
                return false;
            }
            match value {
                Some(v) => held.claims.insert(key.clone(), v.clone()),
                None => held.claims.remove(key),
            };
            true
        });
    }

    /// Records what the API server now holds under `key`.
    pub fn record(&mut self, key: Key, value: Option<Stored>) {
        self.entries.insert(key, (value, Instant::now()));
    }
}

fn key(c: &PortClaim) -> Key {
    (c.metadata.ns().to_string(), c.metadata.name.to_string())
}

/// The API object for a claim, at resourceVersion `rv` if given.
pub fn resource(c: &PortClaim, rv: Option<&str>) -> PortClaimResource {
    let mut r = PortClaimResource::new(&c.metadata.name, c.spec.clone());
    r.metadata.namespace = Some(c.metadata.ns().to_string());
    r.metadata.resource_version = rv.map(str::to_string);
    r.status = c.status.clone();
    r
}

/// The model claim (and its resourceVersion) of an API object.
pub fn from_resource(r: &PortClaimResource) -> Result<Stored, ClaimError> {
    let invalid = |message: String| ClaimError::Invalid {
        namespace: r.namespace().unwrap_or_default(),
        name: r.name_any(),
        message,
    };
    let value = serde_json::to_value(r).map_err(|e| invalid(e.to_string()))?;
    let claim: PortClaim = serde_path_to_error::deserialize(value)
        .map_err(|e| invalid(format!("field {}: {}", e.path(), e.inner())))?;
    Ok((Arc::new(claim), r.resource_version().unwrap_or_default()))
}

/// Writes the changes that turn `held` into `want`: deletions, then releases, then
/// creations (so a port handed over within one plan is free when its new claim comes).
/// Every write first checks leadership. On a race the claim is read again into
/// `recent` and `Raced` is returned; the changes made until then are in `recent` too.
pub async fn commit(
    client: &Client,
    leadership: &Leadership,
    held: &Held,
    want: &crate::model::ClaimList,
    recent: &mut Recent,
    done: &mut Vec<Change>,
) -> Result<(), ClaimError> {
    let have = held.list();
    let writes = claim_writes(&have, want);
    let rv = |c: &PortClaim| held.claims.get(&key(c)).map(|(_, rv)| rv.clone());
    for c in writes.deletes {
        let (ns, name) = key(c);
        leadership.ensure(|| format!("deletion of PortClaim {ns}/{name}"))?;
        let api: Api<PortClaimResource> = Api::namespaced(client.clone(), &ns);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: rv(c),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) if api_code(&e) == Some(409) => return reread(&api, &ns, &name, recent).await,
            Err(source) => return Err(api_error("deleting", &ns, &name, source)),
        }
        recent.record((ns, name), None);
        done.push(Change::Deleted(c.clone()));
    }
    for c in writes.updates {
        let (ns, name) = key(c);
        leadership.ensure(|| format!("status of PortClaim {ns}/{name}"))?;
        let api: Api<PortClaimResource> = Api::namespaced(client.clone(), &ns);
        let body = resource(c, rv(c).as_deref());
        match api
            .replace_status(&name, &PostParams::default(), &body)
            .await
        {
            Ok(stored) => recent.record((ns, name), Some(from_resource(&stored)?)),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => {
                return reread(&api, &ns, &name, recent).await
            }
            Err(source) => return Err(api_error("updating the status of", &ns, &name, source)),
        }
        if c.is_released() {
            done.push(Change::Released(c.clone()));
        }
    }
    for c in writes.creates {
        // A released claim that is not stored holds nothing worth creating.
        if c.is_released() {
            continue;
        }
        let (ns, name) = key(c);
        leadership.ensure(|| format!("PortClaim {ns}/{name}"))?;
        let api: Api<PortClaimResource> = Api::namespaced(client.clone(), &ns);
        let created = match api.create(&PostParams::default(), &resource(c, None)).await {
            Ok(created) => created,
            // The name is the lock: someone holds this port already.
            Err(e) if api_code(&e) == Some(409) => return reread(&api, &ns, &name, recent).await,
            Err(source) => return Err(api_error("creating", &ns, &name, source)),
        };
        // The status subresource ignores status on create; record the phase for
        // `kubectl get portclaims`. The claim is ours alone, so a merge patch is safe.
        let stored = match &c.status {
            Some(status) => api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": status })),
                )
                .await
                .map_err(|source| api_error("setting the status of", &ns, &name, source))?,
            None => created,
        };
        recent.record((ns, name), Some(from_resource(&stored)?));
        done.push(Change::Created(c.clone()));
    }
    Ok(())
}

fn api_error(action: &'static str, ns: &str, name: &str, source: kube::Error) -> ClaimError {
    ApiError::about(action, "PortClaim", ns, name)(source).into()
}

/// Reads a claim that changed under us into `recent`, and reports the race.
async fn reread(
    api: &Api<PortClaimResource>,
    ns: &str,
    name: &str,
    recent: &mut Recent,
) -> Result<(), ClaimError> {
    let current = api
        .get_opt(name)
        .await
        .map_err(|source| api_error("reading", ns, name, source))?;
    let value = current.as_ref().map(from_resource).transpose()?;
    recent.record((ns.to_string(), name.to_string()), value);
    Err(ClaimError::Raced {
        namespace: ns.to_string(),
        name: name.to_string(),
    })
}
