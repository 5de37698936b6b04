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

/// A `nats-server` with JetStream (file storage in a temporary directory)
/// of the test's own, killed when dropped.
pub struct NatsServer {
    /// The port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server on a free port.
    pub async fn start() -> anyhow::Result<Self> {
        let mut server = Self {
            port: free_port()?,
            dir: tempfile::tempdir()?,
            child: None,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start nats-server (is it installed?): {e}"))?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "nats-server on port {} did not listen within 20 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server process.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| anyhow::anyhow!("nats-server is not running"))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts it again on the same port and store directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill()?;
        self.spawn().await
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A TCP proxy on a free port in front of `127.0.0.1:{target}`, for a
/// client whose connections a test cuts ([`Proxy::cut`]) while the server
/// stays up. Stops when dropped.
pub struct Proxy {
    /// The port clients connect to.
    pub port: u16,
    cut: tokio::sync::watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: u16) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = tokio::sync::watch::channel(0_u64);
        let cuts = cut.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        // Both sockets dropped: the client sees its connection closed.
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Ok(Self { port, cut, accept })
    }

    /// Closes every connection open through the proxy; new ones are
    /// accepted as before.
    pub fn cut(&self) {
        self.cut.send_modify(|cuts| *cuts += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
