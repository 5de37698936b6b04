//! Counting, progress bars, percentiles and the process's peak memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::Notify;

/// Counts handler calls and signals once a target is reached.
#[derive(Debug)]
pub(crate) struct Counter {
    count: AtomicU64,
    target: u64,
    reached: Notify,
}

impl Counter {
    pub(crate) fn new(target: u64) -> Arc<Self> {
        Arc::new(Self {
            count: AtomicU64::new(0),
            target,
            reached: Notify::new(),
        })
    }

    /// Counts one call.
    pub(crate) fn hit(&self) {
        self.add(1);
    }

    /// Counts `n` calls.
    pub(crate) fn add(&self, n: u64) {
        let before = self.count.fetch_add(n, Ordering::Relaxed);
        if before < self.target && before.saturating_add(n) >= self.target {
            // notify_one keeps a permit when nobody waits yet, so this is never lost.
            self.reached.notify_one();
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Returns once the target is reached (at once if it already was).
    pub(crate) async fn reached(&self) {
        if self.target == 0 {
            return;
        }
        self.reached.notified().await;
    }
}

/// A progress bar on stderr, refreshed from a counter by a task of its own so
/// the measured code pays one relaxed atomic add per message and nothing more.
/// Hidden when stderr is not a terminal or progress is off.
pub(crate) struct Progress {
    bar: ProgressBar,
    refresher: tokio::task::JoinHandle<()>,
}

impl Progress {
    pub(crate) fn start(
        show: bool,
        label: &str,
        total: Option<u64>,
        position: impl Fn() -> u64 + Send + 'static,
    ) -> Self {
        let target = if show {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(total, target);
        let template = if total.is_some() {
            "{prefix:>34} [{bar:30}] {pos:>8}/{len:<8} {per_sec:>14} {elapsed:>4}"
        } else {
            "{prefix:>34} {spinner} {pos:>8} messages {per_sec:>14} {elapsed:>4}"
        };
        let style = ProgressStyle::with_template(template)
            .map(|style| style.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        let shown = bar.clone();
        let refresher = tokio::spawn(async move {
            loop {
                shown.set_position(position());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { bar, refresher }
    }

    pub(crate) fn finish(self) {
        self.refresher.abort();
        self.bar.finish_and_clear();
    }
}

/// p50, p99 and p99.9 of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// Nearest-rank percentiles of `samples` (sorted here); `None` when empty.
pub(crate) fn percentiles(samples: &mut [Duration]) -> Option<Percentiles> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let at = |p: f64| {
        // Nearest rank: the smallest sample with at least p of the sample at or below it.
        let rank = (p * samples.len() as f64).ceil() as usize;
        let index = rank.clamp(1, samples.len()) - 1;
        samples[index].as_secs_f64() * 1000.0
    };
    Some(Percentiles {
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        p999_ms: at(0.999),
        max_ms: at(1.0),
    })
}

/// Resets the process's peak resident set size (Linux: writing 5 to
/// `/proc/self/clear_refs`), so the next [`peak_rss_kib`] covers only what
/// follows. Returns whether it worked; elsewhere the peak covers the whole run.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set size in KiB (`VmHWM` of
/// `/proc/self/status`); `None` where that file does not exist.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=1000).map(Duration::from_millis).collect();
        let p = percentiles(&mut samples).unwrap();
        assert_eq!(p.p50_ms, 500.0);
        assert_eq!(p.p99_ms, 990.0);
        assert_eq!(p.p999_ms, 999.0);
        assert_eq!(p.max_ms, 1000.0);
        assert!(percentiles(&mut []).is_none());
    }

    #[tokio::test]
    async fn the_counter_signals_a_target_reached_before_anyone_waits() {
        let counter = Counter::new(2);
        counter.hit();
        counter.hit();
        counter.reached().await;
        assert_eq!(counter.count(), 2);
    }

    #[test]
    fn peak_rss_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_rss_kib().unwrap() > 0);
        }
    }
}
