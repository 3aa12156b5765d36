//! What the snapshot asks to be checked: each BackendHealthPolicy read into a `Check`
//! (or what is wrong with it, naming the field), and one `Target` per endpoint of its
//! target Services. Pure.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use crate::model::{BackendHealthPolicy, EndpointSlice, Snapshot, Str};

/// How one policy checks an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What is asked.
    pub kind: CheckKind,
    /// The port asked (`None`: the endpoint's own).
    pub port: Option<u16>,
    /// Between two checks of an endpoint.
    pub interval: Duration,
    /// A check not answered this long fails.
    pub timeout: Duration,
    /// Checks passed in a row that make an unhealthy endpoint healthy.
    pub healthy_threshold: u32,
    /// Checks failed in a row that make a healthy endpoint unhealthy.
    pub unhealthy_threshold: u32,
}

impl Check {
    /// A TCP check with every default (for tests).
    #[cfg(test)]
    pub fn tcp_with_defaults() -> Check {
        Check {
            kind: CheckKind::Tcp,
            port: None,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
        }
    }
}

/// What a check asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// A TCP connection is accepted.
    Tcp,
    /// A UDP datagram is answered.
    Udp {
        /// The datagram sent.
        send: Vec<u8>,
        /// The bytes the answer begins with.
        expect: Vec<u8>,
    },
    /// A GET is answered with an expected status.
    Http {
        /// The path asked.
        path: String,
        /// The statuses that pass (200-399 when empty).
        statuses: Vec<u16>,
    },
}

impl CheckKind {
    /// The transport the endpoint's port must be of.
    fn udp(&self) -> bool {
        matches!(self, CheckKind::Udp { .. })
    }
}

/// The policy (namespace, name) a target comes from, and the Service it targets.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The policy's namespace (its targets' too).
    pub namespace: Str,
    /// The policy's name.
    pub policy: Str,
    /// The target Service's name.
    pub service: Str,
}

/// One endpoint to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Whose.
    pub owner: Arc<Owner>,
    /// The endpoint's address and the port checked.
    pub endpoint: SocketAddr,
    /// How.
    pub check: Arc<Check>,
}

/// What the snapshot asks: the targets, and per policy what is wrong with it (a bad
/// field, a target that is not a Service or is not there): those are not checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Every endpoint to check.
    pub targets: Vec<Target>,
    /// `namespace/name: problem`, one per problem.
    pub problems: Vec<String>,
}

/// The checks `snapshot`'s policies ask for.
pub fn wanted(snapshot: &Snapshot) -> Wanted {
    let mut out = Wanted::default();
    for policy in &snapshot.backend_health_policies {
        let (ns, name) = (policy.metadata.ns(), policy.metadata.name.as_str());
        let check = match check_of(policy) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                out.problems.push(format!("{ns}/{name}: {e}"));
                continue;
            }
        };
        for (i, t) in policy.spec.target_refs.iter().enumerate() {
            if let Err((_, problem)) = target_of(snapshot, ns, i, t) {
                out.problems.push(format!("{ns}/{name}: {problem}"));
                continue;
            }
            let owner = Arc::new(Owner {
                namespace: ns.into(),
                policy: name.into(),
                service: t.name.as_str().into(),
            });
            let slices = snapshot.endpoint_slices.iter().filter(|s| {
                s.metadata.ns() == ns
                    && s.metadata
                        .labels
                        .get("kubernetes.io/service-name")
                        .map(|v| v.as_str())
                        == Some(t.name.as_str())
            });
            for slice in slices {
                match endpoints(slice, &check) {
                    Ok(list) => out.targets.extend(list.into_iter().map(|endpoint| Target {
                        owner: Arc::clone(&owner),
                        endpoint,
                        check: Arc::clone(&check),
                    })),
                    Err(e) => out.problems.push(format!(
                        "{ns}/{name}: EndpointSlice {ns}/{}: {e}",
                        slice.metadata.name
                    )),
                }
            }
        }
    }
    // One check per endpoint and policy, also where slices list it twice.
    out.targets
        .sort_by(|a, b| (&a.owner, a.endpoint).cmp(&(&b.owner, b.endpoint)));
    out.targets
        .dedup_by(|a, b| a.owner == b.owner && a.endpoint == b.endpoint);
    out
}

/// Whether target `i` of a policy in namespace `ns` is a Service there; if not, the
/// status reason (`Invalid`, `TargetNotFound`) and what is wrong.
pub fn target_of(
    snapshot: &Snapshot,
    ns: &str,
    i: usize,
    t: &crate::model::PolicyTargetRef,
) -> Result<(), (&'static str, String)> {
    if !t.group.is_empty() || t.kind != "Service" {
        return Err((
            "Invalid",
            format!(
                "spec.targetRefs[{i}]: {}/{} is not a Service",
                t.group, t.kind
            ),
        ));
    }
    if !snapshot
        .services
        .iter()
        .any(|s| s.metadata.ns() == ns && s.metadata.name == t.name)
    {
        return Err((
            "TargetNotFound",
            format!("spec.targetRefs[{i}]: Service {ns}/{} not found", t.name),
        ));
    }
    Ok(())
}

/// The addresses of `slice`'s endpoints (every condition: a check says whether one is
/// alive, its readiness is Kubernetes'), with the port `check` asks.
fn endpoints(slice: &EndpointSlice, check: &Check) -> Result<Vec<SocketAddr>, String> {
    let port = match check.port {
        Some(p) => p,
        None => {
            let want = if check.kind.udp() { "UDP" } else { "TCP" };
            let ports: Vec<u16> = slice
                .ports
                .iter()
                .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == want)
                .filter_map(|p| p.port)
                .collect();
            match ports.as_slice() {
                [p] => *p,
                [] if slice.endpoints.is_empty() => return Ok(Vec::new()),
                _ => {
                    return Err(format!(
                        "{} {want} ports: spec.check.port must say which is checked",
                        ports.len()
                    ))
                }
            }
        }
    };
    Ok(slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect())
}

/// A policy's check, or what is wrong with it (naming the field).
pub fn check_of(policy: &BackendHealthPolicy) -> Result<Check, String> {
    let spec = &policy.spec;
    let c = &spec.check;
    let kind = match c.kind.as_str() {
        "TCP" => CheckKind::Tcp,
        "UDP" => {
            let udp = c
                .udp
                .as_ref()
                .ok_or("spec.check.udp is required for a UDP check (sendHex, expectHex)")?;
            let send = hex(&udp.send_hex).map_err(|e| format!("spec.check.udp.sendHex: {e}"))?;
            if send.is_empty() {
                return Err("spec.check.udp.sendHex: empty".into());
            }
            let expect = match &udp.expect_hex {
                Some(h) => hex(h).map_err(|e| format!("spec.check.udp.expectHex: {e}"))?,
                None => Vec::new(),
            };
            CheckKind::Udp { send, expect }
        }
        "HTTP" => {
            let http = c.http.clone().unwrap_or_default();
            let path = http.path.unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.bytes().any(|b| b.is_ascii_whitespace()) {
                return Err(format!(
                    "spec.check.http.path {path:?}: a path beginning with / without spaces"
                ));
            }
            if let Some(s) = http
                .expected_statuses
                .iter()
                .find(|s| !(100..600).contains(*s))
            {
                return Err(format!(
                    "spec.check.http.expectedStatuses: {s} is not an HTTP status"
                ));
            }
            CheckKind::Http {
                path,
                statuses: http.expected_statuses,
            }
        }
        other => return Err(format!("spec.check.type {other:?}: TCP, UDP or HTTP")),
    };
    if c.port == Some(0) {
        return Err("spec.check.port: 0 is not a port".into());
    }
    let interval = duration("spec.interval", spec.interval.as_deref(), 5)?;
    let timeout = duration("spec.timeout", spec.timeout.as_deref(), 1)?;
    if timeout >= interval {
        return Err(format!(
            "spec.timeout {} must be shorter than spec.interval {}",
            humantime::format_duration(timeout),
            humantime::format_duration(interval)
        ));
    }
    let threshold = |field: &str, v: Option<u32>, default: u32| match v {
        None => Ok(default),
        Some(n @ 1..=100) => Ok(n),
        Some(n) => Err(format!("{field} {n}: between 1 and 100")),
    };
    Ok(Check {
        kind,
        port: c.port,
        interval,
        timeout,
        healthy_threshold: threshold("spec.healthyThreshold", spec.healthy_threshold, 2)?,
        unhealthy_threshold: threshold("spec.unhealthyThreshold", spec.unhealthy_threshold, 3)?,
    })
}

/// A duration field (`5s`, `500ms`), `default_s` seconds when absent; at least 10 ms and
/// at most an hour.
fn duration(field: &str, v: Option<&str>, default_s: u64) -> Result<Duration, String> {
    let Some(v) = v else {
        return Ok(Duration::from_secs(default_s));
    };
    let d = humantime::parse_duration(v).map_err(|e| format!("{field} {v:?}: {e}"))?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err(format!("{field} {v:?}: between 10ms and 1h"));
    }
    Ok(d)
}

/// Bytes from hex (spaces allowed between bytes).
fn hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).map_err(|_| "not hex".to_string())?;
            u8::from_str_radix(text, 16).map_err(|_| format!("{text:?} is not a hex byte"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn policy(yaml: &str) -> BackendHealthPolicy {
        serde_yaml::from_str(yaml).expect("policy")
    }

    const BASE: &str = "metadata: {name: h, namespace: a}\nspec:\n  targetRefs: [{group: '', kind: Service, name: web}]\n";

    #[test]
    fn a_policy_reads_into_its_check_with_defaults() {
        let p = policy(&format!("{BASE}  check: {{type: TCP}}\n"));
        assert_eq!(check_of(&p), Ok(Check::tcp_with_defaults()));
        let p = policy(&format!(
            "{BASE}  check: {{type: UDP, port: 53, udp: {{sendHex: 'ab 01', expectHex: AB}}}}\n  interval: 2s\n  timeout: 500ms\n"
        ));
        let c = check_of(&p).expect("check");
        assert_eq!(
            c.kind,
            CheckKind::Udp {
                send: vec![0xab, 1],
                expect: vec![0xab]
            }
        );
        assert_eq!(
            (c.port, c.interval, c.timeout),
            (Some(53), Duration::from_secs(2), Duration::from_millis(500))
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let cases = [
            ("  check: {type: ICMP}\n", "spec.check.type \"ICMP\""),
            ("  check: {type: UDP}\n", "spec.check.udp is required"),
            (
                "  check: {type: UDP, udp: {sendHex: xyz1}}\n",
                "spec.check.udp.sendHex",
            ),
            (
                "  check: {type: HTTP, http: {path: 'no-slash'}}\n",
                "spec.check.http.path",
            ),
            (
                "  check: {type: HTTP, http: {expectedStatuses: [700]}}\n",
                "expectedStatuses: 700",
            ),
            (
                "  check: {type: TCP}\n  interval: 1s\n  timeout: 2s\n",
                "spec.timeout 2s must be shorter",
            ),
            (
                "  check: {type: TCP}\n  interval: soon\n",
                "spec.interval \"soon\"",
            ),
            (
                "  check: {type: TCP}\n  unhealthyThreshold: 0\n",
                "spec.unhealthyThreshold 0",
            ),
            ("  check: {type: TCP, port: 0}\n", "spec.check.port: 0"),
        ];
        for (spec, want) in cases {
            let err = check_of(&policy(&format!("{BASE}{spec}"))).expect_err(spec);
            assert!(err.contains(want), "{spec}: {err}");
        }
    }

    #[test]
    fn every_endpoint_of_the_target_services_is_a_target_and_problems_are_named() {
        let docs = "\
apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: a}\nspec: {ports: [{port: 80}]}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: a, labels: {kubernetes.io/service-name: web}}\n\
addressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}, {addresses: [10.0.0.2], conditions: {ready: false}}]\nports: [{port: 8080}]\n---\n\
apiVersion: berth.dev/v1alpha1\nkind: BackendHealthPolicy\nmetadata: {name: h, namespace: a}\n\
spec: {targetRefs: [{kind: Service, name: web}, {kind: Service, name: gone}, {group: apps, kind: Deployment, name: d}], check: {type: TCP}}\n";
        let parsed = crate::manifests::parse_file(std::path::Path::new("p.yaml"), docs);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
        let mut snap = Snapshot::default();
        for o in parsed.objects {
            snap.push(o);
        }
        let w = wanted(&snap);
        let endpoints: Vec<String> = w.targets.iter().map(|t| t.endpoint.to_string()).collect();
        assert_eq!(endpoints, ["10.0.0.1:8080", "10.0.0.2:8080"]);
        assert_eq!(
            w.problems,
            [
                "a/h: spec.targetRefs[1]: Service a/gone not found",
                "a/h: spec.targetRefs[2]: apps/Deployment is not a Service"
            ]
        );
    }
}
