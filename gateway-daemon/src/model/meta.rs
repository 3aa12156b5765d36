//! Object metadata and label selectors, shared by every kind.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Str;

/// Object metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    /// Name.
    pub name: super::Str,
    /// Namespace; `default` when absent on a namespaced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<super::Str>,
    /// UID, if the object came from an API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<super::Str>,
    /// Generation (for `observedGeneration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// RFC 3339 creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<super::Time>,
    /// Labels.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// An object's labels: few, read by key. One sorted allocation, where a `BTreeMap` took
/// a node of about 540 bytes for a single label (every EndpointSlice has one: 50 MB
/// at 100,000 routes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Str, Str)]>);

impl Labels {
    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&Str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The labels, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = (&Str, &Str)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Sets label `key` to `value`.
    pub fn insert(&mut self, key: Str, value: Str) {
        *self = std::mem::take(self)
            .0
            .into_vec()
            .into_iter()
            .chain([(key, value)])
            .collect();
    }
}

impl FromIterator<(Str, Str)> for Labels {
    /// A key given twice keeps its last value, as in a map.
    fn from_iter<I: IntoIterator<Item = (Str, Str)>>(iter: I) -> Self {
        let map: BTreeMap<Str, Str> = iter.into_iter().collect();
        Labels(map.into_iter().collect())
    }
}

impl Serialize for Labels {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<Str, Str>::deserialize(d)?;
        Ok(Labels(map.into_iter().collect()))
    }
}

impl Meta {
    /// The namespace, `default` when unset.
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// A label selector (`matchLabels` and `matchExpressions`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must all be present with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions that must all hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In`/`NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector. An unknown operator matches nothing.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.iter().any(|x| x == v)),
                    "NotIn" => value.is_none_or(|v| !e.values.iter().any(|x| x == v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_as_a_map_are_found_by_key_and_written_back_in_key_order() {
        let meta: Meta = serde_yaml::from_str(
            "name: x\nlabels: {zone: b, app: web, kubernetes.io/service-name: s}",
        )
        .expect("meta");
        assert_eq!(meta.labels.get("app").map(|v| v.as_str()), Some("web"));
        assert_eq!(meta.labels.get("zone").map(|v| v.as_str()), Some("b"));
        assert_eq!(
            meta.labels
                .get("kubernetes.io/service-name")
                .map(|v| v.as_str()),
            Some("s")
        );
        assert_eq!(meta.labels.get("ap"), None);
        assert_eq!(
            serde_json::to_string(&meta.labels).expect("json"),
            r#"{"app":"web","kubernetes.io/service-name":"s","zone":"b"}"#
        );
        let mut labels = meta.labels.clone();
        labels.insert("app".into(), "api".into());
        labels.insert("a".into(), "1".into());
        let keys: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("a", "1"),
                ("app", "api"),
                ("kubernetes.io/service-name", "s"),
                ("zone", "b")
            ]
        );
        let selector = LabelSelector {
            match_labels: [("app".to_string(), "api".to_string())].into(),
            match_expressions: vec![],
        };
        assert!(selector.matches(&labels) && !selector.matches(&meta.labels));
    }
}
