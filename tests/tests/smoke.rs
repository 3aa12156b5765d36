use berth_tests::{packet::Packet, xdp::*};
use berth::datapath::*;

#[test]
fn smoke() {
    let mut t = TestDatapath::load();
    let fx = FixtureNet::new();
    let svc = ServiceAddr { addr: net::GW, protocol: Protocol::Tcp, port: 80 };
    let desired = DesiredState::default().with_service(svc, vec![WeightedBackend { endpoint: net::sa(net::B1, 8080), weight: 1 }]);
    t.dp.apply(&desired).unwrap();
    let p = Packet::tcp(net::sa(net::CLIENT, 40000), net::sa(net::GW, 80)).macs(net::CLIENT_MAC, net::FX0_MAC);
    let (v, out) = fx.ns.enter(|| run_gateway(&mut t.dp, fx.fx0, &p.frame()));
    println!("{} {}", verdict_name(v), berth_tests::packet::decode(&out));
    println!("{:?}", t.dp.counters().unwrap());
}
