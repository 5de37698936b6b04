//! The library behind the `courier` command line.
//!
//! [`database`] says which database a URL names and runs migrations;
//! [`ops`] holds the operator verbs (publish, status, dead letters,
//! subscriptions) that work on the database directly; [`streams`] the
//! `courier streams` verbs, to a stream backend directly or to a daemon;
//! [`bench`] measures Courier (enqueue, drain, pickup latency) against
//! hand-written SQL doing the same work on the same machine, so each number
//! comes with its ratio to what the database can do right now. The binary in
//! `main.rs` is a thin layer of argument parsing over these modules; a
//! `benches/` target can call [`bench::run`] the same way.

pub mod bench;
pub mod database;
pub mod ops;
pub mod streams;
