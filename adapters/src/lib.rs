//! std adapters (being written).
