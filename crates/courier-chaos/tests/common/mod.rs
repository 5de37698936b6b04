//! What several scenario files share: the daemon run in-process.

// Each scenario file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

/// The daemon (the library behind `courier serve`) running in this process.
pub(crate) struct InProcessDaemon {
    address: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), courier_server::ServeError>>,
}

impl InProcessDaemon {
    /// Starts the daemon on the TOML configuration `config`.
    pub(crate) async fn start(config: &str) -> anyhow::Result<Self> {
        let config = courier_server::config::Config::from_toml_str(config)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let daemon = courier_server::bind(config, async move {
            let _ = stopped.await;
        })
        .await?;
        Ok(Self {
            address: daemon.local_addr(),
            stop,
            task: tokio::spawn(daemon.finished()),
        })
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

    /// Shuts it down, as SIGTERM would, and waits (up to 30 s) until it has.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task).await???;
        Ok(())
    }
}
