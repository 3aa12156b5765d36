//! Rebuilds the XDP program when `bpf-linker` changes.

use which::which;

/// Building this crate needs `bpf-linker`; rebuild when it changes.
fn main() {
    match which("bpf-linker") {
        Ok(path) => {
            println!("cargo:rerun-if-changed={}", path.display());
            println!("cargo:rustc-link-arg-bins=--disable-expand-memcpy-in-order");
            // LLVM refuses a stack slot at r10 - 512, the last 8 of the 512 bytes the
            // verifier allows (its check is `offset <= -limit`); at 520 LLVM allows
            // exactly the verifier's 512 and refuses anything deeper, as before.
            // `berth_v6` uses all 512 since its services' tables have sizes.
            println!("cargo:rustc-link-arg-bins=--llvm-args=-bpf-stack-size=520");
        }
        Err(err) => panic!("bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
