//! The library behind the `courier` command line.
//!
//! [`database`] says which database a URL names and runs migrations;
//! [`commands`] holds the operator verbs (publish, cancel, status, dead
//! letters, subscriptions), each written once against a [`commands::Target`]:
//! the database directly or a running daemon; [`ops`] what they stand on (the
//! database's operations, the daemon's API client, NDJSON and tables);
//! [`streams`] the `courier streams` verbs, to a stream backend directly or
//! to a daemon;
//! [`bench`] measures Courier (enqueue, drain, pickup latency) against
//! hand-written SQL doing the same work on the same machine, so each number
//! comes with its ratio to what the database can do right now. The binary in
//! `main.rs` is a thin layer of argument parsing over these modules; a
//! `benches/` target can call [`bench::run`] the same way.

pub mod bench;
pub mod commands;
pub mod database;
pub mod ops;
pub mod streams;
