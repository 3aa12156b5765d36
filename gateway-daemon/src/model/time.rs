//! Points in time as objects carry them (Kubernetes' `metav1.Time`): RFC 3339 text where
//! they are read and written (objects, statuses, journals, the API), a value inside.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A point in time. Read from RFC 3339 text (`2026-01-01T00:00:00Z`, fractions of a
/// second kept), written as RFC 3339 text (whole seconds when it has no fraction, as
/// Kubernetes writes them). Times Berth makes are whole seconds (`Time::at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(SystemTime);

impl Time {
    /// `t`, to the whole second before it (as conditions and claims record times).
    pub fn at(t: SystemTime) -> Self {
        let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        Time(UNIX_EPOCH + Duration::from_secs(since.as_secs()))
    }

    /// The time RFC 3339 `text` names.
    pub fn parse(text: &str) -> Option<Self> {
        humantime::parse_rfc3339_weak(text).ok().map(Time)
    }

    /// As a `SystemTime`.
    pub fn system(self) -> SystemTime {
        self.0
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self
            .0
            .duration_since(UNIX_EPOCH)
            .map_or(true, |d| d.subsec_nanos() == 0);
        if whole {
            write!(f, "{}", humantime::format_rfc3339_seconds(self.0))
        } else {
            write!(f, "{}", humantime::format_rfc3339_nanos(self.0))
        }
    }
}

impl serde::Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Time;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 time (2026-01-01T00:00:00Z)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Time, E> {
                Time::parse(v).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(Text)
    }
}

/// An optional time where a text that is no time reads as none (`serde(deserialize_with)`).
pub(super) fn lenient<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Time>, D::Error> {
    let text: Option<std::borrow::Cow<'de, str>> = serde::Deserialize::deserialize(d)?;
    Ok(text.and_then(|t| Time::parse(&t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_reads_and_writes_the_text_kubernetes_writes() {
        for text in [
            "2026-01-01T00:00:00Z",
            "2026-12-07T01:02:03Z",
            "2026-01-01T00:00:00.5Z",
        ] {
            let t = Time::parse(text).expect("RFC 3339");
            let written = if text.contains('.') {
                "2026-01-01T00:00:00.500000000Z"
            } else {
                text
            };
            assert_eq!(t.to_string(), written);
            assert_eq!(
                serde_json::to_string(&t).expect("json"),
                format!("\"{written}\"")
            );
            let back: Time = serde_json::from_str(&format!("\"{text}\"")).expect("json");
            assert_eq!(back, t);
        }
        assert!(Time::parse("yesterday").is_none());
        let err = serde_json::from_str::<Time>("\"yesterday\"").expect_err("not a time");
        assert!(err.to_string().contains("RFC 3339"), "{err}");
    }

    #[test]
    fn times_berth_makes_are_whole_seconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_767_225_600_999);
        assert_eq!(Time::at(t).to_string(), "2026-01-01T00:00:00Z");
        assert!(Time::at(t) < Time::parse("2026-01-01T00:00:01Z").expect("time"));
    }
}
