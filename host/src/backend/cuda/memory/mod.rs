//! Device memory: a pool of size-classed allocations reused in stream order, and pinned host
//! staging buffers for uploads and downloads.

pub mod bench;
pub mod landing;
pub mod pool;
pub mod registered;
pub mod staging;

pub use landing::Landings;
pub use pool::{DevBuf, Pool};
pub use registered::Registered;
pub use staging::Staging;
