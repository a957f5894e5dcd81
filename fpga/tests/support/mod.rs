//! Shared code of the tests (and the `xrt_bindgen` example).
#![allow(dead_code)]

pub mod xrt_bindgen;
