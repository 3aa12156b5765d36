//! What `berth run` says when the kernel refuses the XDP mode asked for (issue 31): native
//! XDP on an interface whose MTU its driver cannot take in one page (a 9000-byte MTU on a
//! veth) is refused naming the MTU and the way out, where the kernel said only "Numerical
//! result out of range". Needs root.

use berth_tests::{daemon::Dirs, topo::Topology};

#[test]
fn native_xdp_on_an_interface_with_a_9000_byte_mtu_is_refused_naming_the_mtu() {
    let topo = Topology::new(1);
    // Both ends: the kernel checks the peer's MTU, the largest frame that can arrive.
    topo.gateway.ip(&["link", "set", "c0", "mtu", "9000"]);
    topo.client.ip(&["link", "set", "eth0", "mtu", "9000"]);
    let dirs = Dirs::with_examples();
    let stderr = dirs.refused_start(&topo, &["--xdp-mode", "native"]);
    assert!(
        stderr.contains("interface c0 in native mode: its MTU (9000;")
            && stderr.contains("--xdp-mode skb"),
        "{stderr}"
    );
}
