//! The `mock-csi-driver` binary.

fn main() {}
