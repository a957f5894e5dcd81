//! Shared helpers for tandem's cross-backend integration tests.
