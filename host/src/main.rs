//! The `tandem` command line.

fn main() {}
