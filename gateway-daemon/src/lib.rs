//! Berth: one L4 gateway address shared by many owners, one port each.
//!
//! This library holds the daemon's parts; the `berth` binary is a thin `main` over it.

#![deny(unsafe_code)]

pub mod admin;
pub mod announce;
pub mod crd;
pub mod datapath;
pub mod health;
pub mod host;
pub mod host_listeners;
pub mod kubernetes;
pub mod manifests;
pub mod memory;
pub mod model;
pub mod monitor;
pub mod netlink;
pub mod output;
pub mod planner;
pub mod publish;
pub mod reconcile;
pub mod standalone;
pub mod state_document;
pub mod store;
#[allow(
    unsafe_code,
    reason = "the system calls, each unsafe block with its SAFETY comment"
)]
mod sys;
pub mod vec_map;

/// An error and its sources on one line, `: `-separated (for logs and test failures).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
