//! How full each range listener is, said in its status: a listener whose ports are at
//! least `NEARLY_FULL_PERCENT` % bound or cooling down carries a
//! `berth.dev/RangeNearlyFull` condition (as MetalLB reports a pool's use), so that an
//! operator sees it coming before routes wait with `PortRangeExhausted`. Applied after
//! every plan, full or incremental, from the plan's usage (pure).

use super::{condition, ListenerUsage, Plan, Reason, RANGE_NEARLY_FULL};
use crate::model::Time;

/// From this share of a range bound or cooling down, the listener says so.
pub const NEARLY_FULL_PERCENT: u32 = 90;

impl ListenerUsage {
    /// Ports bound or cooling down, in percent of the range (rounded down).
    pub fn percent(&self) -> u32 {
        ((u64::from(self.bound + self.cooling) * 100) / u64::from(self.size.max(1))) as u32
    }
}

/// Sets the `RANGE_NEARLY_FULL` condition of every range listener of `plan` from its
/// usage: present (True) when nearly full, absent otherwise.
pub(super) fn mark_nearly_full(plan: &mut Plan, now: &Time) {
    for u in &plan.usage {
        let full = u.percent() >= NEARLY_FULL_PERCENT;
        let Some(gw) = plan
            .gateways
            .iter_mut()
            .find(|g| g.namespace == u.namespace && g.name == u.gateway)
        else {
            continue;
        };
        let Some(l) = gw
            .status
            .listeners
            .iter_mut()
            .find(|l| l.name == u.listener)
        else {
            continue;
        };
        let had = l.conditions.iter().any(|c| c.kind == RANGE_NEARLY_FULL);
        if !full && !had {
            continue;
        }
        l.conditions.retain(|c| c.kind != RANGE_NEARLY_FULL);
        if full {
            let message = format!(
                "{} of {} ports bound or cooling down ({} %)",
                u.bound + u.cooling,
                u.size,
                u.percent()
            );
            let generation = l.conditions.first().and_then(|c| c.observed_generation);
            l.conditions.push(condition(
                RANGE_NEARLY_FULL,
                true,
                Reason::RangeNearlyFull,
                message,
                now,
                generation,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        test_support::{plan_of, range_gateway, route, CLASS},
        Plan, RANGE_NEARLY_FULL,
    };
    /// A range listener says when it is nearly full (`berth.dev/RangeNearlyFull`), and
    /// `berth get listeners` prints its use.
    #[test]
    fn a_range_listener_nine_tenths_full_says_so() {
        let plan_with = |routes: u64| {
            let mut text = format!("{CLASS}{}", range_gateway("gw", 0, "pool", 30000, 30009));
            for i in 0..routes {
                text.push_str(&route(
                    "TCPRoute",
                    &format!("r{i}"),
                    i,
                    "name: gw, namespace: infra",
                ));
            }
            plan_of(&text, [])
        };
        let nearly_full = |plan: &Plan| {
            plan.gateways[0].status.listeners[0]
                .conditions
                .iter()
                .find(|c| c.kind == RANGE_NEARLY_FULL)
                .map(|c| (c.status.to_string(), c.message.to_string()))
        };
        assert_eq!(nearly_full(&plan_with(8)), None, "8 of 10 ports");
        let plan = plan_with(9);
        assert_eq!(
            nearly_full(&plan),
            Some((
                "True".to_string(),
                "9 of 10 ports bound or cooling down (90 %)".to_string()
            ))
        );
        let table = crate::output::listener_table(&plan.usage);
        let row = table.lines().nth(1).expect("a row");
        assert!(
            row.contains("30000-30009") && row.ends_with("   90"),
            "{table}"
        );
    }
}
