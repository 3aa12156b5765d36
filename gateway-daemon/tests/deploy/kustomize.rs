//! Kustomizations: each directory's lists every YAML file there, in apply order.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(
    dead_code,
    reason = "read for the field check; only `name` is compared"
)]
pub(super) struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
    digest: Option<String>,
}

/// An image reference without its tag or digest.
pub(super) fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

pub(super) fn kustomization_errors(d: &Deploy) -> Vec<String> {
    let mut e = Vec::new();
    // Directory → its YAML files (kustomization.yaml aside).
    let mut dirs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for file in d.files.keys().filter(|f| is_yaml(f)) {
        let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
        let entry = dirs.entry(dir).or_default();
        if name != "kustomization.yaml" {
            entry.insert(name);
        }
    }
    for (dir, yamls) in dirs {
        let path = join(dir, "kustomization.yaml");
        let Some(text) = d.files.get(&path) else {
            e.push(format!(
                "deploy/{dir} has YAML files but no kustomization.yaml"
            ));
            continue;
        };
        let k: Kustomization = match serde_yaml::from_str(text) {
            Ok(k) => k,
            Err(err) => {
                e.push(format!("deploy/{path}: {err}"));
                continue;
            }
        };
        if k.api_version != "kustomize.config.k8s.io/v1beta1" || k.kind != "Kustomization" {
            e.push(format!(
                "deploy/{path}: not a kustomize.config.k8s.io/v1beta1 Kustomization"
            ));
        }
        let listed: BTreeSet<&str> = k.resources.iter().map(String::as_str).collect();
        if listed.len() != k.resources.len() {
            e.push(format!("deploy/{path} lists a file twice"));
        }
        for f in yamls.difference(&listed) {
            e.push(format!("deploy/{path} does not list {f}"));
        }
        for f in listed.difference(&yamls) {
            e.push(format!(
                "deploy/{path} lists {f}, which is not a YAML file there"
            ));
        }
        e.extend(order_errors(d, dir, &k.resources));

        // Images: `kustomize edit set image` must find the ones the containers use.
        let docs: Vec<&Doc> = d
            .docs
            .iter()
            .filter(|doc| k.resources.iter().any(|r| join(dir, r) == doc.file))
            .collect();
        let used: BTreeSet<&str> = docs
            .iter()
            .filter(|doc| doc.kind() == "DaemonSet")
            .flat_map(|doc| {
                ["initContainers", "containers"]
                    .into_iter()
                    .flat_map(move |list| {
                        doc.value["spec"]["template"]["spec"][list]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["image"].as_str())
                    })
            })
            .map(repository)
            .collect();
        let named: BTreeSet<&str> = k.images.iter().map(|i| i.name.as_str()).collect();
        for image in used.difference(&named) {
            e.push(format!(
                "deploy/{path}: images does not name {image}, which the DaemonSet runs"
            ));
        }
        for image in named.difference(&used) {
            e.push(format!(
                "deploy/{path}: images names {image}, which nothing runs"
            ));
        }
    }
    e
}

/// Within one kustomization, a Namespace comes before the objects in it and a CRD before
/// the objects of its kind.
pub(super) fn order_errors(d: &Deploy, dir: &str, resources: &[String]) -> Vec<String> {
    let files: Vec<String> = resources.iter().map(|r| join(dir, r)).collect();
    let docs: Vec<&Doc> = files
        .iter()
        .flat_map(|f| d.docs.iter().filter(move |doc| &doc.file == f))
        .collect();
    let namespaces: BTreeSet<&str> = docs
        .iter()
        .filter(|doc| doc.kind() == "Namespace")
        .map(|doc| doc.name())
        .collect();
    let crd_kinds: BTreeSet<&str> = docs
        .iter()
        .filter(|doc| doc.kind() == "CustomResourceDefinition")
        .map(|doc| doc.str("/spec/names/kind"))
        .collect();
    let mut seen_namespaces = BTreeSet::new();
    let mut seen_kinds = BTreeSet::new();
    let mut e = Vec::new();
    for doc in docs {
        if let Some(ns) = doc.namespace() {
            if namespaces.contains(ns) && !seen_namespaces.contains(ns) {
                e.push(format!("{}: applied before its Namespace {ns}", doc.at()));
            }
        }
        if crd_kinds.contains(doc.kind()) && !seen_kinds.contains(doc.kind()) {
            e.push(format!("{}: applied before its CRD", doc.at()));
        }
        match doc.kind() {
            "Namespace" => {
                seen_namespaces.insert(doc.name());
            }
            "CustomResourceDefinition" => {
                seen_kinds.insert(doc.str("/spec/names/kind"));
            }
            _ => {}
        }
    }
    e
}
