//! Test helper: races to create PortClaims for ports `FIRST..FIRST+COUNT` in a state
//! directory (no lock, so only the store's exclusive creation decides), then prints
//! the ports it won, one per line.
//!
//! `berth-claim-race STATE_DIR WHO COUNT`

use berth::{
    model::{ClaimRoute, PortClaim, PortClaimSpec},
    store::{Store, StoreError},
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, who, count] = args.as_slice() else {
        eprintln!("usage: berth-claim-race STATE_DIR WHO COUNT");
        std::process::exit(2);
    };
    let count: u16 = count.parse().expect("COUNT");
    let store = Store::open(std::path::Path::new(dir)).expect("open store");
    for port in 30000..30000 + count {
        let route = ClaimRoute::new(berth::model::RouteKind::Tcp, who, "r", None);
        let claim = PortClaim::bound(
            "infra",
            PortClaimSpec::new("gw", "pool", "TCP", port, route),
        );
        match store.create(&claim) {
            Ok(()) => println!("{port}"),
            Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
}
