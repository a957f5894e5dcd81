//! The CUDA backend (cudarc, dynamic loading).

use std::sync::Arc;

use super::{Backend, DeviceKind, Missing};

/// Looks for CUDA devices.
pub fn discover() -> (Vec<Arc<dyn Backend>>, Vec<Missing>) {
    (
        Vec::new(),
        vec![Missing {
            kind: DeviceKind::Cuda,
            reason: "the CUDA backend is not part of this build yet".into(),
        }],
    )
}
