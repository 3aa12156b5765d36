//! The announce decision, step by step in time, without a kernel or a clock.

use super::*;

/// `EXAMPLE_SINCE`, the origin of the tests' time.
const T0: Duration = Duration::from_secs(1_796_428_800);

/// The instant `secs` seconds after the test's origin.
fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(secs)
}

fn machine() -> Announce {
    Announce::new(Timing {
        not_ready_grace: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(30),
    })
}

fn ready() -> Inputs<'static> {
    Inputs::default()
}

fn not_ready(why: &'static str) -> Inputs<'static> {
    Inputs {
        not_ready: Some(why),
        ..Inputs::default()
    }
}

fn drained_at(secs: u64) -> Inputs<'static> {
    Inputs {
        operator_drain: Some(at(secs)),
        ..Inputs::default()
    }
}

fn served() -> Vec<IpAddr> {
    vec!["10.0.0.1".parse().unwrap(), "2001:db8::1".parse().unwrap()]
}

#[test]
fn a_ready_node_announces_every_served_address_from_its_first_decision() {
    let mut m = machine();
    let (d, t) = m.decide(at(0), ready());
    assert_eq!(
        (d.state, d.since, d.reason),
        (State::Announced, at(0), None)
    );
    assert_eq!(
        t,
        Some(Transition {
            from: None,
            to: State::Announced
        })
    );
    assert_eq!(
        published(d.state.announcing(), served()),
        served().into_iter().collect::<BTreeSet<_>>()
    );
}

#[test]
fn a_withdrawn_node_publishes_no_address_whatever_it_serves() {
    for state in State::ALL.into_iter().filter(|s| !s.announcing()) {
        assert_eq!(
            published(state.announcing(), served()),
            BTreeSet::new(),
            "{state:?}"
        );
    }
}

#[test]
fn a_node_not_ready_within_the_grace_period_keeps_announcing() {
    let mut m = machine();
    m.decide(at(0), ready());
    for s in [1, 5, 10] {
        let (d, t) = m.decide(at(s), not_ready("the last cycle failed"));
        assert_eq!((d.state, t), (State::Announced, None), "at {s}s");
        assert_eq!(d.since, at(0), "announcing since the start");
    }
}

#[test]
fn a_node_not_ready_for_longer_than_the_grace_period_withdraws_saying_since_when_and_why() {
    let mut m = machine();
    m.decide(at(0), ready());
    m.decide(at(3), not_ready("disk full"));
    let (d, _) = m.decide(at(12), not_ready("disk full"));
    assert_eq!(d.state, State::Announced, "9 s not ready is within 10 s");
    let (d, t) = m.decide(at(13), not_ready("disk full"));
    assert_eq!((d.state, d.since), (State::NotReady, at(3)));
    let reason = d.reason.unwrap();
    assert!(reason.contains("--not-ready-grace 10s"), "{reason}");
    assert!(reason.contains("disk full"), "{reason}");
    assert_eq!(
        t,
        Some(Transition {
            from: Some(State::Announced),
            to: State::NotReady
        })
    );
}

#[test]
fn a_node_ready_again_announces_again_at_once_and_a_new_spell_has_a_new_grace() {
    let mut m = machine();
    m.decide(at(0), not_ready("no plan yet"));
    assert_eq!(m.decide(at(10), not_ready("x")).0.state, State::NotReady);
    let (d, t) = m.decide(at(11), ready());
    assert_eq!((d.state, d.since), (State::Announced, at(11)));
    assert_eq!(t.map(|t| t.from), Some(Some(State::NotReady)));
    // Not ready again: the grace counts from the new spell.
    assert_eq!(m.decide(at(12), not_ready("x")).0.state, State::Announced);
    assert_eq!(m.decide(at(21), not_ready("x")).0.state, State::Announced);
    assert_eq!(m.decide(at(22), not_ready("x")).0.state, State::NotReady);
}

#[test]
fn an_operator_drain_is_draining_for_the_drain_timeout_then_drained() {
    let mut m = machine();
    m.decide(at(0), ready());
    let (d, t) = m.decide(at(5), drained_at(5));
    assert_eq!((d.state, d.since), (State::Draining, at(5)));
    assert_eq!(
        d.reason.as_deref(),
        Some("addresses withdrawn by berth drain")
    );
    assert_eq!(
        t,
        Some(Transition {
            from: Some(State::Announced),
            to: State::Draining
        })
    );
    assert_eq!(m.decide(at(34), drained_at(5)).0.state, State::Draining);
    let (d, t) = m.decide(at(35), drained_at(5));
    assert_eq!(
        (d.state, d.since),
        (State::Drained, at(5)),
        "since the drain"
    );
    assert_eq!(t.map(|t| t.to), Some(State::Drained));
    // Undrained: announcing again.
    let (d, t) = m.decide(at(40), ready());
    assert_eq!((d.state, d.since), (State::Announced, at(40)));
    assert_eq!(t.map(|t| t.from), Some(Some(State::Drained)));
}

#[test]
fn a_drain_persisted_before_a_restart_is_drained_from_the_first_decision() {
    let mut m = machine();
    let (d, t) = m.decide(at(100), drained_at(10));
    assert_eq!((d.state, d.since), (State::Drained, at(10)));
    assert_eq!(
        t,
        Some(Transition {
            from: None,
            to: State::Drained
        })
    );
    let mut m = machine();
    assert_eq!(m.decide(at(20), drained_at(10)).0.state, State::Draining);
}

#[test]
fn an_undrained_node_that_was_not_ready_all_along_is_withdrawn_at_once() {
    let mut m = machine();
    let drained_and_failing = Inputs {
        not_ready: Some("disk full"),
        operator_drain: Some(at(0)),
        stopping: None,
    };
    m.decide(at(0), drained_and_failing);
    assert_eq!(
        m.decide(at(60), drained_and_failing).0.state,
        State::Drained
    );
    let (d, _) = m.decide(at(61), not_ready("disk full"));
    assert_eq!((d.state, d.since), (State::NotReady, at(0)));
}

#[test]
fn stopping_wins_over_a_drain_and_over_not_being_ready() {
    let mut m = machine();
    m.decide(at(0), drained_at(0));
    let everything = Inputs {
        not_ready: Some("disk full"),
        operator_drain: Some(at(0)),
        stopping: Some(at(50)),
    };
    let (d, t) = m.decide(at(70), everything);
    assert_eq!((d.state, d.since), (State::Stopping, at(50)));
    assert_eq!(t.map(|t| t.to), Some(State::Stopping));
    assert!(d.reason.unwrap().contains("SIGTERM"));
    let ready_but_stopping = Inputs {
        stopping: Some(at(50)),
        ..Inputs::default()
    };
    assert_eq!(
        m.decide(at(71), ready_but_stopping).0.state,
        State::Stopping
    );
}

#[test]
fn a_transition_is_reported_once_however_often_the_node_decides() {
    let mut m = machine();
    let transitions: Vec<Transition> = (0..100)
        .filter_map(|s| {
            let inputs = if s < 50 { ready() } else { drained_at(50) };
            m.decide(at(s), inputs).1
        })
        .collect();
    assert_eq!(
        transitions.iter().map(|t| t.to).collect::<Vec<_>>(),
        vec![State::Announced, State::Draining, State::Drained]
    );
}

#[test]
fn a_clock_that_goes_back_never_ends_a_drain_or_a_grace_early() {
    let mut m = machine();
    let (d, _) = m.decide(at(0), drained_at(100));
    assert_eq!(
        d.state,
        State::Draining,
        "a drain in the future has age zero"
    );
    let mut m = machine();
    m.decide(at(100), not_ready("x"));
    assert_eq!(m.decide(at(50), not_ready("x")).0.state, State::Announced);
}

/// A status whose state began at the test's origin, `at(0)`.
fn status(state: State, reason: Option<&str>) -> Status {
    let s = Status::example(state, reason, &[]);
    assert_eq!(humantime::parse_rfc3339(&s.since).ok(), Some(at(0)));
    s
}

#[test]
fn readiness_names_the_state_its_cause_and_its_age() {
    let s = status(State::Draining, Some("addresses withdrawn by berth drain"));
    assert_eq!(
        s.summary(at(12)),
        "draining: addresses withdrawn by berth drain 12s ago"
    );
    let stopping = status(
        State::Stopping,
        Some("addresses withdrawn on SIGTERM (--drain-on-stop)"),
    );
    assert_eq!(
        stopping.summary(at(2)),
        "stopping: addresses withdrawn on SIGTERM (--drain-on-stop) 2s ago; the daemon \
         exits --drain-timeout (30s) after the signal"
    );
    assert_eq!(status(State::Announced, None).summary(at(5)), "announced");
}

#[test]
fn the_banner_of_a_withdrawn_node_names_the_cause_the_age_and_the_withdrawn_addresses() {
    let s = status(State::Draining, Some("by berth drain"));
    assert_eq!(
        s.banner(at(12)).as_deref(),
        Some(
            "NODE DRAINING (berth drain, 12s ago): 10.0.0.1, 2001:db8::1 withdrawn; \
             existing flows are served"
        )
    );
    assert_eq!(s.places(), "berth0, table 100");
    let announced = Status::example(State::Announced, None, &["10.0.0.1", "2001:db8::1"]);
    assert_eq!(announced.banner(at(1)), None);
    assert!(announced.withdrawn().is_empty());
    let nowhere = Status {
        interface: None,
        table: None,
        ..announced
    };
    assert_eq!(nowhere.places(), "nowhere");
}

#[test]
fn the_status_document_uses_the_documented_names() {
    let json = serde_json::to_value(status(State::NotReady, Some("x"))).unwrap();
    assert_eq!(json["state"], "withdrawn-not-ready");
    for field in [
        "reason",
        "since",
        "addresses",
        "served",
        "interface",
        "table",
        "drainTimeout",
        "operatorDrain",
        "applied",
    ] {
        assert!(json.get(field).is_some(), "no {field} in {json}");
    }
    assert_eq!(State::NotReady.metric_label(), "not_ready");
    let back: Status = serde_json::from_value(json).unwrap();
    assert_eq!(back.state, State::NotReady);
}
