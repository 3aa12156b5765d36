//! Object names checked as the API server checks them (DNS-1123 labels and
//! subdomains, DNS-1035 labels for Services), and listener names as Gateway API's
//! `SectionName`.

use crate::model::Object;

/// Checks `metadata.name` and `metadata.namespace` as the API server does: names are
/// DNS-1123 subdomains of up to 253 characters (routes, Gateways, EndpointSlices...),
/// DNS-1123 labels for Namespaces and DNS-1035 labels for Services (63), namespaces
/// labels. (A route named with a newline in it once split its claim's journal record,
/// and the daemon never planned again after a restart; route names of 64 to 253
/// characters, which Kubernetes allows, were once refused.)
pub(super) fn check_names(kind: &str, meta: Option<&serde_yaml::Value>) -> Result<(), String> {
    let field = |key: &str| meta.and_then(|m| m.get(key));
    let name = match field("name") {
        None => return Err("field metadata.name is missing".to_string()),
        Some(v) => v
            .as_str()
            .ok_or_else(|| "field metadata.name: not a string".to_string())?,
    };
    let namespace = match field("namespace") {
        None => None,
        Some(ns) => Some(
            ns.as_str()
                .ok_or_else(|| "field metadata.namespace: not a string".to_string())?,
        ),
    };
    check_object_names(kind, name, namespace)
}

/// [`check_names`] for a name and namespace read already.
pub(super) fn check_object_names(
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> Result<(), String> {
    let problem = match kind {
        "Namespace" => dns_label_problem(name),
        "Service" => dns1035_label_problem(name),
        _ => dns_subdomain_problem(name),
    };
    if let Some(p) = problem {
        return Err(format!("field metadata.name: {name:?} {p}"));
    }
    if let Some(ns) = namespace {
        if let Some(p) = dns_label_problem(ns) {
            return Err(format!("field metadata.namespace: {ns:?} {p}"));
        }
    }
    Ok(())
}

/// Whether `s` is lowercase letters, digits and '-', starting and ending with a letter
/// or digit (a DNS-1123 label's characters, of any length).
fn label_chars(s: &str) -> bool {
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Why `s` is not a DNS-1123 label (at most 63 lowercase letters, digits and '-',
/// starting and ending with a letter or digit), if it is not.
fn dns_label_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 63 {
        return Some("is longer than 63 characters (a DNS-1123 label)");
    }
    if !label_chars(s) {
        return Some(
            "is not a DNS-1123 label (lowercase letters, digits and '-', \
             starting and ending with a letter or digit)",
        );
    }
    None
}

/// Why `s` is not a DNS-1035 label (a DNS-1123 label starting with a letter), as
/// Kubernetes names Services, if it is not.
fn dns1035_label_problem(s: &str) -> Option<&'static str> {
    dns_label_problem(s).or_else(|| {
        (!s.as_bytes()[0].is_ascii_lowercase()).then_some(
            "is not a DNS-1035 label (lowercase letters, digits and '-', \
             starting with a letter and ending with a letter or digit)",
        )
    })
}

/// Why `s` is not a DNS-1123 subdomain (at most 253 characters: dot-separated parts
/// of lowercase letters, digits and '-', each starting and ending with a letter or
/// digit; Kubernetes sets no length for the parts), if it is not.
fn dns_subdomain_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 253 {
        return Some("is longer than 253 characters (a DNS-1123 subdomain)");
    }
    if !s.split('.').all(label_chars) {
        return Some(
            "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit)",
        );
    }
    None
}

/// Why `s` is not a Gateway API `SectionName` (a listener's name: at most 253
/// lowercase letters, digits and '-', starting and ending with a letter or digit), if
/// it is not.
fn section_name_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 253 {
        return Some("is longer than 253 characters (a Gateway API SectionName)");
    }
    if !label_chars(s) {
        return Some(
            "is not a valid listener name (a Gateway API SectionName: lowercase letters, \
             digits and '-', starting and ending with a letter or digit)",
        );
    }
    None
}

/// Checks the listener names an object holds as Gateway API's `SectionName`, naming
/// the field: a Gateway's listeners, a GatewayConfig's ranges, a route's parentRefs'
/// `sectionName`. (Listener names with quotes and newlines were once taken, and broke
/// the tables of `berth get` and the claims that carry them.)
pub(super) fn check_listener_names(o: &Object) -> Result<(), String> {
    let names: Vec<(String, &str)> = match o {
        Object::Gateway(g) => listener_fields(g.spec.listeners.iter().map(|l| l.name.as_str())),
        Object::GatewayConfig(c) => {
            listener_fields(c.spec.listeners.iter().map(|l| l.name.as_str()))
        }
        Object::Route(r) => r
            .spec
            .parent_refs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let name = p.section_name.as_deref()?;
                Some((format!("spec.parentRefs[{i}].sectionName"), name))
            })
            .collect(),
        _ => Vec::new(),
    };
    for (field, name) in names {
        if let Some(p) = section_name_problem(name) {
            return Err(format!("field {field}: {name:?} {p}"));
        }
    }
    Ok(())
}

/// `(spec.listeners[i].name, name)` for each of `names`.
fn listener_fields<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(String, &'a str)> {
    names
        .enumerate()
        .map(|(i, n)| (format!("spec.listeners[{i}].name"), n))
        .collect()
}
