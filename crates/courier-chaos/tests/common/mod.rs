//! What several scenario files share: the daemon as the real `courier
//! serve` process.

// Each scenario file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The `courier` binary of this build: `target/<profile>/courier`, beside
/// the directory of this test binary (`target/<profile>/deps`). Cargo
/// builds it with the workspace's tests; `scripts/chaos` builds it first.
fn courier_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(std::path::Path::parent)
        .ok_or_else(|| anyhow::anyhow!("no target directory above {}", exe.display()))?;
    let courier = profile.join("courier");
    anyhow::ensure!(
        courier.exists(),
        "{} is missing: build it first (cargo build -p courier-cli; scripts/chaos does)",
        courier.display()
    );
    Ok(courier)
}

/// `courier serve --config …` as a process of its own, killed when dropped.
pub(crate) struct CourierDaemon {
    child: tokio::process::Child,
    address: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl CourierDaemon {
    /// Starts `courier serve` on the TOML configuration `config` (without
    /// `listen`: it listens on a free port) and waits until `/healthz`
    /// answers.
    pub(crate) async fn start(config: &str) -> anyhow::Result<Self> {
        let address: std::net::SocketAddr =
            format!("127.0.0.1:{}", courier_chaos::free_port()?).parse()?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("courier.toml");
        std::fs::write(&path, format!("listen = \"{address}\"\n{config}"))?;
        let mut child = tokio::process::Command::new(courier_binary()?)
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("courier serve exited at start: {status}");
            }
            let healthy = client
                .get(format!("http://{address}/healthz"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if healthy {
                return Ok(Self {
                    child,
                    address,
                    _dir: dir,
                });
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "courier serve did not answer /healthz within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The sum of the counter `name` over its series whose labels include
    /// `label` (such as `outcome="retry"`), from `/metrics`.
    pub(crate) async fn counter(&self, name: &str, label: &str) -> anyhow::Result<f64> {
        let text = reqwest::get(format!("http://{}/metrics", self.address))
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Stops it with SIGTERM and waits (up to 30 s) for its exit, which
    /// must be 0.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow::anyhow!("courier serve already exited"))?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        let exit = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        anyhow::ensure!(
            exit.success(),
            "courier serve exited with {exit} after SIGTERM"
        );
        Ok(())
    }
}
