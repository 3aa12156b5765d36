//! Rebuilds the XDP program when `bpf-linker` changes.

use which::which;

/// Building this crate needs `bpf-linker`; rebuild when it changes.
fn main() {
    match which("bpf-linker") {
        Ok(path) => {
            println!("cargo:rerun-if-changed={}", path.display());
            println!("cargo:rustc-link-arg-bins=--disable-expand-memcpy-in-order");
        }
        Err(err) => panic!("bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
