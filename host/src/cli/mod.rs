//! The `tandem` subcommands, one file each.

pub mod devices;
pub mod op;
pub mod run;
