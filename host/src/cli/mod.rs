//! The `tandem` subcommands, one file each.

pub mod bench;
pub mod compare;
pub mod devices;
pub mod fpga;
pub mod op;
pub mod run;

use std::sync::{Arc, Mutex};

use tandem::plan::History;

/// The op-time history the planner learns from: the user's cache file, or none when
/// `TANDEM_HISTORY=off`.
pub fn history() -> Arc<Mutex<History>> {
    let h = match std::env::var("TANDEM_HISTORY").as_deref() {
        Ok("off") | Ok("0") => History::in_memory(),
        _ => History::user_default(),
    };
    Arc::new(Mutex::new(h))
}
