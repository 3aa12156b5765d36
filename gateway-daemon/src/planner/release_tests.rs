//! Released claims: when a claim is released while its route still attaches, and
//! when a released claim is not bound again.

use super::test_support::{claim, owner, plan_of, range_gateway, route, route_accepted, CLASS};

/// Found by the property test: a route whose range shrank away from its port got
/// that port back as its own released claim, while a newer Gateway on the address,
/// no longer overlapping, had given it to its own route: two routes on one port.
#[test]
fn a_released_claim_outside_the_listeners_range_now_is_not_bound_again() {
    let text = [
        CLASS.to_string(),
        range_gateway("old", 0, "pool", 30000, 30000),
        range_gateway("new", 1, "pool", 30009, 30009),
        route("TCPRoute", "theirs", 0, "name: old, namespace: infra"),
        route("TCPRoute", "mine", 1, "name: new, namespace: infra"),
    ]
    .concat();
    // `theirs` held 30009 while `old`'s range was 30009-30009.
    let claims = [claim("old", "pool", 30009, "theirs")];
    let plan = plan_of(&text, &claims);
    let again = plan_of(&text, &plan.claims);
    for plan in [&plan, &again] {
        assert_eq!(
            route_accepted(plan, "theirs").message,
            "assigned port 30000"
        );
        assert_eq!(route_accepted(plan, "mine").message, "assigned port 30009");
        assert_eq!(owner(plan, 30009), Some("mine"));
        let bound_at_30009 = plan
            .claims
            .iter()
            .filter(|c| c.spec.port == 30009)
            .filter(|c| c.is_bound())
            .count();
        assert_eq!(bound_at_30009, 1, "{:?}", plan.claims);
    }
}

/// Records checked when loaded (issue 12): a claim outside its listener's range, or a
/// second claim of a route on one listener, is released, and the plan says which and
/// why (the daemon logs it, `berth check` prints it) — a route that merely left its
/// listener is released without a word.
#[test]
fn a_claim_released_while_its_route_still_attaches_is_named_with_the_reason() {
    let text = [
        CLASS.to_string(),
        range_gateway("gw", 0, "pool", 30000, 30009),
        route("TCPRoute", "a", 0, "name: gw, namespace: infra"),
        route("TCPRoute", "b", 1, "name: gw, namespace: infra"),
    ]
    .concat();
    let claims = [
        claim("gw", "pool", 30001, "a"),
        claim("gw", "pool", 30002, "a"),
        claim("gw", "pool", 31500, "b"),
        claim("gw", "pool", 30005, "gone"),
    ];
    let plan = plan_of(&text, &claims);
    assert_eq!(
        plan.released,
        [
            "claim infra/gw-tcp-30002 (TCP 30002) released: its route already holds another \
             port of listener pool",
            "claim infra/gw-tcp-31500 (TCP 31500) released: port 31500 is outside listener \
             pool's range 30000-30009",
        ],
        "{:?}",
        plan.claims
    );
    assert_eq!(route_accepted(&plan, "a").message, "assigned port 30001");
    assert_eq!(route_accepted(&plan, "b").message, "assigned port 30000");
    // Released once: the next plan has nothing more to say.
    assert!(plan_of(&text, &plan.claims).released.is_empty());
}
