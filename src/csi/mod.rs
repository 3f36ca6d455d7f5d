//! The client side of CSI: connecting to a driver's Unix socket, probing it,
//! detecting its capabilities and calling it in domain types.

pub mod proto;
