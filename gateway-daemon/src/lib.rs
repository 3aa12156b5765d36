//! Berth: one L4 gateway address shared by many owners, one port each.
//!
//! This library holds the daemon's parts; the `berth` binary is a thin `main` over it.

pub mod admin;
pub mod check;
pub mod crd;
pub mod datapath;
pub mod manifests;
pub mod model;
pub mod planner;
pub mod standalone;
pub mod store;
