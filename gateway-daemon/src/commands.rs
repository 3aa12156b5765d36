//! What the subcommands other than `berth run` do: plan offline (`check`), ask a
//! running daemon (`get`, `drain`, `undrain`), and look after the host (`state`,
//! `uninstall`).
//!
//! Part of the `berth` binary (declared in `main.rs`), not of the library.

mod check;
mod drain;
mod get;
mod state;
mod uninstall;

pub(crate) use check::check_cmd;
pub(crate) use drain::drain_cmd;
pub(crate) use get::get_cmd;
pub(crate) use state::state_cmd;
pub(crate) use uninstall::uninstall;
