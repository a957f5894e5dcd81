//! The kernel cores (datapaths that plug into [`crate::shell`]) and the kernel catalog.

pub mod router;
