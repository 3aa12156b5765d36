//! Shared helpers of Berth's privileged integration tests: packets, network
//! namespaces, and `BPF_PROG_TEST_RUN` of the gateway program.

pub mod cleanup;
pub mod daemon;
pub mod fuzz;
pub mod kube;
pub mod loader;
pub mod loadgen;
pub mod netns;
pub mod packet;
pub mod routing;
pub mod tier;
pub mod topo;
pub mod xdp;
