//! The wire codec (placeholder; being written).
