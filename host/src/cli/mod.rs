//! The `tandem` subcommands, one file each.

pub mod bench;
pub mod devices;
pub mod op;
pub mod run;
