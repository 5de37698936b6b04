//! Dedicated connections for blocking reads.
//!
//! Redis answers one connection's commands in order, so an `XREADGROUP ...
//! BLOCK` sent on the shared multiplexed connection would hold up every
//! command queued behind it for as long as it blocks. Blocking reads
//! therefore each take a connection of their own: an idle one from this
//! pool, or a new one. After a read that ended cleanly (entries, nothing, or
//! an error reply such as NOGROUP) the connection goes back to the pool,
//! which keeps at most [`RedisConfig::idle_blocking_connections`]; one that
//! failed with an I/O error or timed out is closed, since the server may
//! still be blocked on its command. A read that is cancelled (its future
//! dropped) closes its connection with it, which unblocks the server side.
//!
//! Connections are named `courier-read:{prefix}` (`CLIENT SETNAME`), so
//! `CLIENT LIST` shows which store's reads are blocked. The response timeout
//! of each read is its block plus the store's response timeout.
//!
//! A pooled connection may have been closed while idle (a server restart,
//! the server's idle `timeout`); a read that finds its reused connection
//! dropped is sent once more on a fresh one. Entries the lost attempt may
//! have been handed stay pending for the consumer, as after any lost reply.
//!
//! [`RedisConfig::idle_blocking_connections`]: crate::RedisConfig::idle_blocking_connections

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisResult, Value};

pub(crate) struct BlockingConnections {
    client: Client,
    config: AsyncConnectionConfig,
    name: String,
    keep: usize,
    idle: Mutex<Vec<MultiplexedConnection>>,
}

impl BlockingConnections {
    pub(crate) fn new(
        client: Client,
        connection_timeout: Duration,
        prefix: &str,
        keep: usize,
    ) -> Self {
        Self {
            client,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connection_timeout))
                .set_response_timeout(Some(connection_timeout)),
            name: format!("courier-read:{prefix}"),
            keep,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends `command` on a dedicated connection, waiting at most `timeout`
    /// for its reply.
    pub(crate) async fn query(&self, command: &Cmd, timeout: Duration) -> RedisResult<Value> {
        if let Some(connection) = self.take() {
            match self.send(connection, command, timeout).await {
                Err(error) if error.is_connection_dropped() => {}
                result => return result,
            }
        }
        let connection = self.open().await?;
        self.send(connection, command, timeout).await
    }

    /// How many idle connections the pool holds.
    pub(crate) fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    async fn send(
        &self,
        mut connection: MultiplexedConnection,
        command: &Cmd,
        timeout: Duration,
    ) -> RedisResult<Value> {
        connection.set_response_timeout(timeout);
        let result = command.query_async(&mut connection).await;
        match &result {
            Err(error) if error.is_io_error() || error.is_timeout() => {}
            _ => self.put(connection),
        }
        result
    }

    async fn open(&self) -> RedisResult<MultiplexedConnection> {
        let mut connection = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(&self.name)
            .exec_async(&mut connection)
            .await?;
        Ok(connection)
    }

    fn take(&self) -> Option<MultiplexedConnection> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    fn put(&self, connection: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.keep {
            idle.push(connection);
        }
    }
}
