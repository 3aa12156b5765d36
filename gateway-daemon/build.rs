//! Builds the XDP program (crate `gateway-ebpf`) and hands its object to the daemon.

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

/// Builds the XDP program (crate `gateway-ebpf`) for `bpfel-unknown-none` with the
/// nightly toolchain; `datapath::load` embeds the object.
fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("gateway-daemon has no parent directory"))?
        .join("gateway-ebpf");
    let root = root
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", root.display()))?;
    let package = Package {
        name: "gateway-ebpf",
        root_dir: root,
        ..Default::default()
    };
    aya_build::build_ebpf([package], Toolchain::default())
}
