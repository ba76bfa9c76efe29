//! Honest measurements: the machine a call ran on (its fingerprint), the
//! agent's own threads kept off the call's cores, and the call's cores
//! tuned for measurement.

pub mod fingerprint;
pub mod pin;
pub mod tune;
