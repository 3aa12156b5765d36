//! Object names checked as the API server checks them (DNS-1123 labels and
//! subdomains).

/// Checks `metadata.name` and `metadata.namespace` as the API server does: names are
/// DNS-1123 subdomains (labels for Namespaces and Services), namespaces labels. (A
/// route named with a newline in it once split its claim's journal record, and the
/// daemon never planned again after a restart.)
pub(super) fn check_names(kind: &str, meta: Option<&serde_yaml::Value>) -> Result<(), String> {
    let field = |key: &str| meta.and_then(|m| m.get(key));
    let name = match field("name") {
        None => return Err("field metadata.name is missing".to_string()),
        Some(v) => v
            .as_str()
            .ok_or_else(|| "field metadata.name: not a string".to_string())?,
    };
    let label_only = matches!(kind, "Namespace" | "Service");
    let problem = if label_only {
        dns_label_problem(name)
    } else {
        dns_subdomain_problem(name)
    };
    if let Some(p) = problem {
        return Err(format!("field metadata.name: {name:?} {p}"));
    }
    if let Some(ns) = field("namespace") {
        let ns = ns
            .as_str()
            .ok_or_else(|| "field metadata.namespace: not a string".to_string())?;
        if let Some(p) = dns_label_problem(ns) {
            return Err(format!("field metadata.namespace: {ns:?} {p}"));
        }
    }
    Ok(())
}

/// Why `s` is not a DNS-1123 label (at most 63 lowercase letters, digits and '-',
/// starting and ending with a letter or digit), if it is not.
fn dns_label_problem(s: &str) -> Option<&'static str> {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 63 {
        return Some("is longer than 63 characters (a DNS-1123 label)");
    }
    let b = s.as_bytes();
    if !b.iter().all(|&c| alnum(c) || c == b'-') || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Some(
            "is not a DNS-1123 label (lowercase letters, digits and '-', \
             starting and ending with a letter or digit)",
        );
    }
    None
}

/// Why `s` is not a DNS-1123 subdomain (at most 253 characters, dot-separated labels),
/// if it is not.
fn dns_subdomain_problem(s: &str) -> Option<&'static str> {
    if s.len() > 253 {
        return Some("is longer than 253 characters (a DNS-1123 subdomain)");
    }
    if s.split('.').any(|l| dns_label_problem(l).is_some()) {
        return Some(
            "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit)",
        );
    }
    None
}
