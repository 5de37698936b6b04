//! Servers a fault test starts for itself, on a free port, so it can kill and
//! restart them without touching the shared ones other tests use.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it next).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `redis-server` of the test's own, in a temporary directory, killed
/// when dropped.
pub struct RedisServer {
    /// The port it listens on.
    pub port: u16,
    /// Whether it keeps an append-only file (`appendfsync always`): what
    /// it acknowledged survives a kill.
    pub durable: bool,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port; with `durable`, every write is in
    /// its append-only file before it is acknowledged.
    pub async fn start(durable: bool) -> anyhow::Result<Self> {
        let mut server = Self {
            port: free_port()?,
            durable,
            dir: tempfile::tempdir()?,
            child: None,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut command = Command::new("redis-server");
        command
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--dir")
            .arg(self.dir.path());
        if self.durable {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start redis-server (is it installed?): {e}"))?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port).await {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "redis-server on port {} did not answer within 10 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the server with SIGKILL (no shutdown, no final save).
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Runs one command through `redis-cli` as a client of its own (for
    /// faults such as `CLIENT KILL TYPE normal` or `CLIENT PAUSE 2000`);
    /// its reply.
    pub fn command(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = std::process::Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(args)
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run redis-cli (is it installed?): {e}"))?;
        anyhow::ensure!(output.status.success(), "redis-cli {args:?} failed");
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Starts it again on the same port and directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill()?;
        self.spawn().await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether a Redis server answers PING on `port`.
async fn ping(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if stream.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read_exact(&mut reply)).await,
        Ok(Ok(_))
    ) && &reply == b"+PONG\r\n"
}
