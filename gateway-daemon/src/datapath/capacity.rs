//! What the datapath's maps hold at most, and what a desired state takes of it: the
//! one measure the planner admits routes by (`planner::capacity`) and the datapath
//! checks a state against before touching a map (`apply`).

use std::fmt;

use super::{DesiredState, Limits, WeightedBackend};

/// A limit of the datapath's maps the planner fits the services into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Limit {
    /// Services: (gateway address, protocol, port), `--max-services`.
    Services,
    /// Backend endpoints over all services (an endpoint of two services is two),
    /// `--max-backends`.
    Backends,
    /// Gateway addresses of one IP family (`Limits::ADDRESSES`, no option). Not
    /// additive: admission counts distinct addresses itself; a `Usage` holds none.
    Addresses,
}

impl Limit {
    /// All, in the order they are checked.
    pub const ALL: [Limit; 3] = [Limit::Services, Limit::Backends, Limit::Addresses];

    /// The `berth run` option that sets it (none sets the addresses).
    pub const fn option(self) -> Option<&'static str> {
        match self {
            Limit::Services => Some("--max-services"),
            Limit::Backends => Some("--max-backends"),
            Limit::Addresses => None,
        }
    }

    /// What it counts, as a metric label and in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Limit::Services => "services",
            Limit::Backends => "backends",
            Limit::Addresses => "addresses",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a limit of the datapath counts, in errors that name one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A limit the planner fits services into.
    Of(Limit),
    /// Entries of the Maglev tables (a table's entries per service).
    MaglevEntries,
    /// Conntrack entries (`--conntrack-size`).
    ConntrackEntries,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Of(limit) => limit.name(),
            Resource::MaglevEntries => "Maglev table entries",
            Resource::ConntrackEntries => "conntrack entries",
        })
    }
}

/// The datapath's room for services and backends (`Limits::services`,
/// `Limits::backends`: `berth run --max-services`, `--max-backends`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Services.
    pub services: u32,
    /// Backend endpoints over all services.
    pub backends: u32,
}

impl Capacity {
    /// The room of maps sized by `limits`.
    pub const fn of(limits: &Limits) -> Self {
        Capacity {
            services: limits.services,
            backends: limits.backends,
        }
    }

    /// The size of `limit`.
    pub const fn of_limit(&self, limit: Limit) -> u32 {
        match limit {
            Limit::Services => self.services,
            Limit::Backends => self.backends,
            Limit::Addresses => Limits::ADDRESSES,
        }
    }
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity::of(&Limits::default())
    }
}

/// What services take of the datapath's room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Services.
    pub services: u64,
    /// Backend slots: one per distinct endpoint of each service.
    pub backends: u64,
}

impl Usage {
    /// What one service with `backends` takes.
    pub fn of_service(backends: &[WeightedBackend]) -> Self {
        Usage {
            services: 1,
            backends: backend_slots(backends),
        }
    }

    /// What every service of `state` takes.
    pub fn of_state(state: &DesiredState) -> Self {
        state
            .services
            .values()
            .fold(Usage::default(), |sum, b| sum.plus(Usage::of_service(b)))
    }

    /// Both together.
    pub const fn plus(self, other: Usage) -> Self {
        Usage {
            services: self.services + other.services,
            backends: self.backends + other.backends,
        }
    }

    /// This without `other` (never below zero).
    pub const fn minus(self, other: Usage) -> Self {
        Usage {
            services: self.services.saturating_sub(other.services),
            backends: self.backends.saturating_sub(other.backends),
        }
    }

    /// How much of `limit` this takes.
    pub const fn of_limit(&self, limit: Limit) -> u64 {
        match limit {
            Limit::Services => self.services,
            Limit::Backends => self.backends,
            // Counted by admission, not summed (see `Limit::Addresses`).
            Limit::Addresses => 0,
        }
    }

    /// The first limit of `capacity` this passes, if it passes one.
    pub fn exceeds(&self, capacity: &Capacity) -> Option<Limit> {
        Limit::ALL
            .into_iter()
            .find(|&l| self.of_limit(l) > u64::from(capacity.of_limit(l)))
    }
}

/// The backend slots a service takes in the maps: one per distinct endpoint (the
/// datapath merges an endpoint given twice, adding its weights).
pub fn backend_slots(backends: &[WeightedBackend]) -> u64 {
    match backends {
        [] | [_] => backends.len() as u64,
        _ => {
            let mut endpoints: Vec<_> = backends.iter().map(|b| b.endpoint).collect();
            endpoints.sort_unstable();
            endpoints.dedup();
            endpoints.len() as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_given_twice_takes_one_slot_and_the_first_limit_passed_is_named() {
        let b = |e: &str| WeightedBackend {
            endpoint: e.parse().expect("endpoint"),
            weight: 1,
        };
        let backends = [b("10.0.0.1:80"), b("10.0.0.2:80"), b("10.0.0.1:80")];
        assert_eq!(backend_slots(&backends), 2);
        let one = Usage::of_service(&backends);
        assert_eq!(
            one,
            Usage {
                services: 1,
                backends: 2
            }
        );
        let capacity = Capacity {
            services: 1,
            backends: 3,
        };
        assert_eq!(one.exceeds(&capacity), None);
        let two = one.plus(one);
        assert_eq!(two.exceeds(&capacity), Some(Limit::Services));
        let fewer = Capacity {
            services: 4,
            backends: 3,
        };
        assert_eq!(two.exceeds(&fewer), Some(Limit::Backends));
        assert_eq!(two.minus(one), one);
    }
}
