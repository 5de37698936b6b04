//! What a bench run found: measurements, the bars they are held to, and the
//! table or JSON they are printed as.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::measure::Percentiles;
use super::{Plan, Throughput};

/// Scenarios the issue names that this bench does not run yet.
pub(crate) const NOT_DONE: [&str; 0] = [];

/// One bench run's results.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// The database's version and the settings that matter.
    pub database: BTreeMap<String, String>,
    /// The machine it ran on.
    pub machine: Machine,
    /// When the run ended (UTC, RFC 3339).
    pub finished_at: String,
    /// Messages the drain scenarios pre-loaded.
    pub messages: u64,
    /// Messages per second in the latency scenario.
    pub rate: u32,
    /// Whether the hand-written baseline ran.
    pub baseline: bool,
    /// The run's sizes, durations and worker settings.
    pub settings: Settings,
    /// Every measurement, in the order taken.
    pub measurements: Vec<Measurement>,
    /// The highest peak resident set of the drain scenarios, in KiB.
    pub peak_rss_kib: Option<u64>,
    /// The bars from the design, checked against this run.
    pub bars: Vec<BarCheck>,
    /// Scenarios not measured yet.
    pub not_done: Vec<String>,
    /// The explain scenario's plans, in the order run (empty unless it ran).
    pub explain: Vec<ExplainedQuery>,
    /// The explain scenario's indexes on deliveries, messages and receipts.
    pub indexes: Vec<IndexInfo>,
}

/// The sizes, durations and worker settings of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Seconds, not minutes (a smoke run).
    pub quick: bool,
    /// Messages each drain case pre-loads.
    pub messages: u64,
    /// The big tenant's backlog in the fairness scenario.
    pub fairness_messages: u64,
    /// Deliveries the explain scenario loads.
    pub explain_messages: u64,
    /// Handlers running at once per worker (drain, fairness, held-xmin).
    pub concurrency: usize,
    /// Whether `concurrency` is the backend's default (no `--concurrency`).
    pub concurrency_is_default: bool,
    /// Deliveries claimed per round trip by those workers.
    pub batch_size: usize,
    /// Whether `batch_size` is the backend's default (no `--batch-size`).
    pub batch_size_is_default: bool,
    /// Seconds held-xmin holds its snapshot open.
    pub hold_seconds: u64,
    /// Seconds of each held-xmin measuring window (before and at the end of the hold).
    pub xmin_window_seconds: f64,
    /// How many times the enqueue and drain scenarios ran.
    pub rounds: u32,
}

/// One hot query's plan, as `EXPLAIN (ANALYZE, BUFFERS)` printed it.
#[derive(Debug, Clone, Serialize)]
pub struct ExplainedQuery {
    /// The query's name in the store (`queries/<name>.sql`).
    pub name: String,
    /// What it was run with.
    pub parameters: String,
    /// The SQL exactly as the store runs it.
    pub sql: String,
    /// The plan, one line per plan row.
    pub plan: String,
}

/// One index on a table the hot queries touch.
#[derive(Debug, Clone, Serialize)]
pub struct IndexInfo {
    /// The table.
    pub table: String,
    /// The index.
    pub name: String,
    /// `CREATE INDEX ...` as `pg_indexes` shows it.
    pub definition: String,
}

/// The machine a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to the process.
    pub cpus: usize,
    /// Total memory, in KiB (`None` without `/proc/meminfo`).
    pub memory_kib: Option<u64>,
    /// `MALLOC_ARENA_MAX` as this process saw it (the `courier` binary sets
    /// 2 unless the environment chose; it moves the peak RSS figures); `None`
    /// when unset (glibc's default, up to 8 arenas per core) or not UTF-8.
    pub malloc_arena_max: Option<String>,
}

impl Machine {
    fn here() -> Self {
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("MemTotal:"))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            });
        Self {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            memory_kib,
            malloc_arena_max: std::env::var("MALLOC_ARENA_MAX").ok(),
        }
    }
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// A stable name, `scenario.case` (`drain.noop`, `latency.wake`, ...).
    pub id: String,
    /// What was measured, in words.
    pub case: String,
    /// Messages (or deliveries) handled.
    pub count: u64,
    /// Wall-clock seconds the work took.
    pub seconds: f64,
    /// Throughput, for enqueue and drain.
    pub per_second: Option<f64>,
    /// Commit → handler start, for latency.
    pub latency: Option<Percentiles>,
    /// The hand-written SQL's throughput on the same work.
    pub baseline_per_second: Option<f64>,
    /// `per_second / baseline_per_second`.
    pub ratio: Option<f64>,
    /// The process's peak resident set during this case, in KiB.
    pub peak_rss_kib: Option<u64>,
    /// Anything a reader should know about this number.
    pub note: Option<String>,
    /// Not run on this backend (the note says why).
    pub skipped: bool,
    /// Further figures of this case (dead tuples, probe round trips, ...).
    pub details: BTreeMap<String, f64>,
    /// Each round's throughput, in the order run, when the case ran in more
    /// than one round (`--rounds`); `per_second` is then their median.
    /// Empty after a single round.
    pub rounds: Vec<f64>,
    /// Each round's ratio to that round's own baseline, in the same order as
    /// `rounds`, when every round had a baseline; `ratio` is then their
    /// median. Empty otherwise.
    pub ratio_rounds: Vec<f64>,
}

impl Measurement {
    pub(crate) fn throughput(
        id: &str,
        case: &str,
        result: Throughput,
        baseline: Option<Throughput>,
    ) -> Self {
        let per_second = result.per_second();
        let baseline_per_second = baseline.map(|b| b.per_second());
        Self {
            id: id.to_owned(),
            case: case.to_owned(),
            count: result.count,
            seconds: result.elapsed.as_secs_f64(),
            per_second: Some(per_second),
            latency: None,
            baseline_per_second,
            ratio: baseline_per_second
                .filter(|b| *b > 0.0)
                .map(|b| per_second / b),
            peak_rss_kib: None,
            note: None,
            skipped: false,
            details: BTreeMap::new(),
            rounds: Vec::new(),
            ratio_rounds: Vec::new(),
        }
    }

    /// A latency case: `count` samples over `seconds`.
    pub(crate) fn latency(
        id: &str,
        case: &str,
        count: u64,
        seconds: f64,
        latency: Percentiles,
    ) -> Self {
        Self {
            id: id.to_owned(),
            case: case.to_owned(),
            count,
            seconds,
            per_second: None,
            latency: Some(latency),
            baseline_per_second: None,
            ratio: None,
            peak_rss_kib: None,
            note: None,
            skipped: false,
            details: BTreeMap::new(),
            rounds: Vec::new(),
            ratio_rounds: Vec::new(),
        }
    }

    /// A case this backend cannot run, and why.
    pub(crate) fn skipped(id: &str, case: &str, why: &str) -> Self {
        Self {
            id: id.to_owned(),
            case: case.to_owned(),
            count: 0,
            seconds: 0.0,
            per_second: None,
            latency: None,
            baseline_per_second: None,
            ratio: None,
            peak_rss_kib: None,
            note: Some(why.to_owned()),
            skipped: true,
            details: BTreeMap::new(),
            rounds: Vec::new(),
            ratio_rounds: Vec::new(),
        }
    }
}

/// One bar from the design, checked.
#[derive(Debug, Clone, Serialize)]
pub struct BarCheck {
    /// What is held to the bar.
    pub bar: String,
    /// What was measured, in the bar's unit.
    pub measured: String,
    /// Whether the bar was met.
    pub met: bool,
}

impl Report {
    pub(crate) fn new(
        database: Vec<(String, String)>,
        plan: &Plan,
        worker_defaults: (usize, usize),
        measurements: Vec<Measurement>,
    ) -> Self {
        let database: BTreeMap<String, String> = database.into_iter().collect();
        let backend = database.get("backend").cloned().unwrap_or_default();
        let peak_rss_kib = measurements
            .iter()
            .filter(|m| m.id.starts_with("drain."))
            .filter_map(|m| m.peak_rss_kib)
            .max();
        let mut report = Self {
            backend,
            database,
            machine: Machine::here(),
            finished_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            messages: plan.messages,
            rate: plan.rate,
            baseline: plan.baseline,
            settings: Settings {
                quick: plan.quick,
                messages: plan.messages,
                fairness_messages: plan.fairness_messages,
                explain_messages: plan.explain_messages,
                concurrency: plan.concurrency.unwrap_or(worker_defaults.0),
                concurrency_is_default: plan.concurrency.is_none(),
                batch_size: plan.batch_size.unwrap_or(worker_defaults.1),
                batch_size_is_default: plan.batch_size.is_none(),
                hold_seconds: plan.hold.as_secs(),
                xmin_window_seconds: plan.xmin_window.as_secs_f64(),
                rounds: plan.rounds,
            },
            measurements,
            peak_rss_kib,
            bars: Vec::new(),
            not_done: NOT_DONE.iter().map(|s| (*s).to_owned()).collect(),
            explain: Vec::new(),
            indexes: Vec::new(),
        };
        report.bars = report.check_bars();
        report
    }

    fn find(&self, id: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| m.id == id)
    }

    fn check_bars(&self) -> Vec<BarCheck> {
        let mut bars = Vec::new();
        let postgres = self.backend == "postgres";
        let noop = self.find("drain.noop");
        if postgres {
            if let Some(ratio) = noop.and_then(|m| m.ratio) {
                bars.push(BarCheck {
                    bar: "no-op drain ≥ 70% of the hand-written baseline".into(),
                    measured: format!("{:.0}%", ratio * 100.0),
                    met: ratio >= 0.70,
                });
            }
        }
        if let (Some(noop), Some(exact)) = (
            noop.and_then(|m| m.per_second),
            self.find("drain.exactly_once").and_then(|m| m.per_second),
        ) {
            let share = exact / noop;
            bars.push(BarCheck {
                bar: "exactly-once drain ≥ 60% of no-op".into(),
                measured: format!("{:.0}%", share * 100.0),
                met: share >= 0.60,
            });
        }
        if let (Some(noop), Some(urgent)) = (
            noop.and_then(|m| m.per_second),
            self.find("drain.priorities").and_then(|m| m.per_second),
        ) {
            let share = urgent / noop;
            bars.push(BarCheck {
                bar: "drain with priorities ≥ 95% of no-op".into(),
                measured: format!("{:.0}%", share * 100.0),
                met: share >= 0.95,
            });
        }
        if let Some(rate) = self.find("enqueue.batch_1000").and_then(|m| m.per_second) {
            bars.push(BarCheck {
                bar: "batched enqueue ≥ 150,000 msg/s".into(),
                measured: format!("{} msg/s", thousands(rate)),
                met: rate >= 150_000.0,
            });
        }
        if postgres {
            if let Some(latency) = self.find("latency.wake").and_then(|m| m.latency) {
                bars.push(BarCheck {
                    bar: "pickup with NOTIFY p50 ≤ 1.5 ms".into(),
                    measured: format!("{:.2} ms", latency.p50_ms),
                    met: latency.p50_ms <= 1.5,
                });
                bars.push(BarCheck {
                    bar: "pickup with NOTIFY p99 ≤ 3 ms".into(),
                    measured: format!("{:.2} ms", latency.p99_ms),
                    met: latency.p99_ms <= 3.0,
                });
            }
        } else if let Some(rate) = noop.and_then(|m| m.per_second) {
            bars.push(BarCheck {
                bar: "SQLite no-op drain ≥ 20,000 msg/s".into(),
                measured: format!("{} msg/s", thousands(rate)),
                met: rate >= 20_000.0,
            });
        }
        if let Some(small) = self.find("fairness.small").and_then(|m| m.latency) {
            bars.push(BarCheck {
                bar: "fairness: small tenants' p99 ≤ 2 s".into(),
                measured: format!("{:.0} ms", small.p99_ms),
                met: small.p99_ms <= 2000.0,
            });
        }
        if let Some(ratio) = self.find("fairness.big").and_then(|m| m.ratio) {
            bars.push(BarCheck {
                bar: "fairness: big tenant ≥ 70% of its solo rate".into(),
                measured: format!("{:.0}%", ratio * 100.0),
                met: ratio >= 0.70,
            });
        }
        if let Some(ratio) = self.find("held_xmin.held").and_then(|m| m.ratio) {
            let loss = (1.0 - ratio) * 100.0;
            bars.push(BarCheck {
                bar: "held xmin: throughput loss ≤ 10%".into(),
                measured: format!("{loss:.0}% loss"),
                met: loss <= 10.0,
            });
        }
        if let Some(kib) = self.peak_rss_kib {
            bars.push(BarCheck {
                bar: "worker peak RSS ≤ 50 MB (bench process, during drains)".into(),
                measured: format!("{:.1} MB", kib as f64 / 1024.0),
                met: kib <= 50 * 1024,
            });
        }
        bars
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// The report as a table for people.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let version = self
            .database
            .get("server_version")
            .or_else(|| self.database.get("sqlite_version"))
            .map_or(String::new(), |v| format!(" {v}"));
        let _ = writeln!(
            out,
            "courier bench on {}{version}: {} messages per drain, {} msg/s trickle, {} CPUs{}",
            self.backend,
            thousands(self.messages as f64),
            self.rate,
            self.machine.cpus,
            self.machine
                .malloc_arena_max
                .as_ref()
                .map_or(String::new(), |arenas| format!(
                    ", MALLOC_ARENA_MAX={arenas}"
                ))
        );
        let settings = &self.settings;
        let source = |is_default: bool| if is_default { " (backend default)" } else { "" };
        let _ = writeln!(
            out,
            "workers: concurrency {}{}, batch size {}{}; fairness backlog {}; held-xmin hold {} s, windows {:.0} s{}{}",
            settings.concurrency,
            source(settings.concurrency_is_default),
            settings.batch_size,
            source(settings.batch_size_is_default),
            thousands(settings.fairness_messages as f64),
            settings.hold_seconds,
            settings.xmin_window_seconds,
            if settings.quick { "; quick" } else { "" },
            if settings.rounds > 1 {
                format!(
                    "; enqueue and drain: median of {} rounds",
                    settings.rounds
                )
            } else {
                String::new()
            },
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<23} {:<44} {:>16} {:>16} {:>7} {:>9}",
            "id", "case", "result", "baseline", "ratio", "peak RSS"
        );
        for m in &self.measurements {
            let result = match (m.per_second, m.latency) {
                _ if m.skipped => "skipped".into(),
                (Some(rate), _) => format!("{} msg/s", thousands(rate)),
                (None, Some(l)) => format!("p50 {:.2} ms", l.p50_ms),
                (None, None) => "-".into(),
            };
            let baseline = m
                .baseline_per_second
                .map_or("-".into(), |b| format!("{} msg/s", thousands(b)));
            let ratio = m.ratio.map_or("-".into(), |r| format!("{r:.2}"));
            let rss = m
                .peak_rss_kib
                .map_or("-".into(), |kib| format!("{:.1} MB", kib as f64 / 1024.0));
            let _ = writeln!(
                out,
                "{:<23} {:<44} {:>16} {:>16} {:>7} {:>9}",
                m.id, m.case, result, baseline, ratio, rss
            );
            if let Some(l) = m.latency {
                let _ = writeln!(
                    out,
                    "{:<23} {:<44} p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms, n = {}",
                    "", "", l.p99_ms, l.p999_ms, l.max_ms, m.count
                );
            }
            if let Some(spread) = spread(&m.rounds) {
                let _ = writeln!(out, "{:<23} {spread}", "");
            }
            if m.ratio_rounds.len() > 1 {
                let ratios: Vec<String> =
                    m.ratio_rounds.iter().map(|r| format!("{r:.2}")).collect();
                let _ = writeln!(
                    out,
                    "{:<23} ratios to each round's baseline {}",
                    "",
                    ratios.join(" / ")
                );
            }
            if !m.details.is_empty() {
                let details: Vec<String> = m
                    .details
                    .iter()
                    .map(|(key, value)| format!("{key} {}", number(*value)))
                    .collect();
                let _ = writeln!(out, "{:<23} {}", "", details.join(", "));
            }
            if let Some(note) = &m.note {
                let _ = writeln!(out, "{:<23} note: {note}", "");
            }
        }
        if !self.indexes.is_empty() || !self.explain.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "EXPLAIN (ANALYZE, BUFFERS) at {} deliveries (each run in a transaction rolled back)",
                thousands(settings.explain_messages as f64)
            );
            let _ = writeln!(out);
            let _ = writeln!(out, "indexes:");
            for index in &self.indexes {
                let _ = writeln!(out, "  {}: {}", index.table, index.definition);
            }
            for query in &self.explain {
                let _ = writeln!(out);
                let _ = writeln!(
                    out,
                    "-- {} (queries/{}.sql as the store renders it): {}",
                    query.name, query.name, query.parameters
                );
                for line in query.plan.lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        if !self.bars.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "bars:");
            for bar in &self.bars {
                let verdict = if bar.met { "met   " } else { "MISSED" };
                let _ = writeln!(out, "  {verdict} {:<58} measured {}", bar.bar, bar.measured);
            }
        }
        if !self.not_done.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "not measured yet: {}", self.not_done.join(", "));
        }
        out
    }
}

/// `rounds 21,086 / 24,273 / 28,190 msg/s (range 29 % of the median)` for
/// a case measured in more than one round.
fn spread(rounds: &[f64]) -> Option<String> {
    if rounds.len() < 2 {
        return None;
    }
    let figures: Vec<String> = rounds.iter().map(|rate| thousands(*rate)).collect();
    let median = median(rounds)?;
    let low = rounds.iter().copied().fold(f64::INFINITY, f64::min);
    let high = rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let range = if median > 0.0 {
        format!(
            " (range {:.0} % of the median)",
            (high - low) / median * 100.0
        )
    } else {
        String::new()
    };
    Some(format!("rounds {} msg/s{range}", figures.join(" / ")))
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when empty.
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => sorted.get(middle).copied(),
        _ => Some((sorted.get(middle - 1)? + sorted.get(middle)?) / 2.0),
    }
}

/// One measurement per case from several rounds of the same scenario, in
/// the first round's order: throughput, baseline and seconds are the
/// medians of the rounds, the ratio the median of each round's ratio to its
/// own baseline, details the median of each figure, peak RSS the highest,
/// and `rounds` lists every round's throughput. A single round comes back
/// as it was; a case skipped in the first round stays as that round has it.
pub(crate) fn merge_rounds(rounds: Vec<Vec<Measurement>>) -> Vec<Measurement> {
    if rounds.len() < 2 {
        return rounds.into_iter().flatten().collect();
    }
    let mut rounds = rounds.into_iter();
    let first = rounds.next().unwrap_or_default();
    let rest: Vec<Vec<Measurement>> = rounds.collect();
    first
        .into_iter()
        .map(|measurement| {
            if measurement.skipped {
                return measurement;
            }
            let mut all = vec![&measurement];
            all.extend(
                rest.iter()
                    .filter_map(|round| round.iter().find(|m| m.id == measurement.id)),
            );
            merge(measurement.clone(), &all)
        })
        .collect()
}

/// `first` with its figures replaced by those of `all` (`first` among them).
fn merge(first: Measurement, all: &[&Measurement]) -> Measurement {
    let of = |pick: fn(&Measurement) -> Option<f64>| -> Option<f64> {
        let values: Vec<f64> = all.iter().filter_map(|m| pick(m)).collect();
        median(&values)
    };
    let mut merged = first;
    merged.per_second = of(|m| m.per_second);
    merged.baseline_per_second = of(|m| m.baseline_per_second);
    merged.ratio = of(|m| m.ratio);
    merged.seconds = of(|m| Some(m.seconds)).unwrap_or(merged.seconds);
    merged.peak_rss_kib = all.iter().filter_map(|m| m.peak_rss_kib).max();
    merged.rounds = all.iter().filter_map(|m| m.per_second).collect();
    let ratios: Option<Vec<f64>> = all.iter().map(|m| m.ratio).collect();
    merged.ratio_rounds = ratios.unwrap_or_default();
    for (key, value) in merged.details.iter_mut() {
        let values: Vec<f64> = all
            .iter()
            .filter_map(|m| m.details.get(key).copied())
            .collect();
        if let Some(middle) = median(&values) {
            *value = middle;
        }
    }
    merged.note = merged_note(all);
    merged
}

/// The rounds' notes: one note when every round had the same one, else
/// each round's own, numbered (`round 2: …; round 5: …`).
fn merged_note(all: &[&Measurement]) -> Option<String> {
    let notes: Vec<Option<&str>> = all.iter().map(|m| m.note.as_deref()).collect();
    let first = notes.first().copied().flatten();
    if notes.iter().all(|note| *note == first) {
        return first.map(str::to_owned);
    }
    let numbered: Vec<String> = notes
        .iter()
        .enumerate()
        .filter_map(|(index, note)| note.map(|note| format!("round {}: {note}", index + 1)))
        .collect();
    Some(numbered.join("; "))
}

/// A detail figure: whole numbers with separators, others with 2 decimals.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        thousands(value)
    } else {
        format!("{value:.2}")
    }
}

/// `1234567.8` as `1,234,568`.
pub(crate) fn thousands(value: f64) -> String {
    let rounded = value.round();
    if !rounded.is_finite() || rounded < 0.0 {
        return format!("{value:.0}");
    }
    let digits = format!("{rounded:.0}");
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(id: &str, per_second: f64, baseline: f64) -> Measurement {
        Measurement::throughput(
            id,
            "case",
            Throughput::new((per_second * 2.0) as u64, std::time::Duration::from_secs(2)),
            Some(Throughput::new(
                (baseline * 2.0) as u64,
                std::time::Duration::from_secs(2),
            )),
        )
    }

    #[test]
    fn rounds_merge_into_medians_with_every_round_listed() {
        let rounds = vec![
            vec![
                rate("drain.noop", 100.0, 400.0),
                Measurement::skipped("drain.processes_1", "case", "PostgreSQL only"),
            ],
            vec![rate("drain.noop", 300.0, 600.0)],
            vec![rate("drain.noop", 200.0, 1000.0)],
        ];
        let merged = merge_rounds(rounds);
        assert_eq!(merged.len(), 2);
        let noop = &merged[0];
        assert_eq!(noop.rounds, vec![100.0, 300.0, 200.0]);
        assert_eq!(noop.ratio_rounds, vec![0.25, 0.5, 0.2]);
        assert_eq!(noop.per_second, Some(200.0));
        assert_eq!(noop.baseline_per_second, Some(600.0));
        // The median of 0.25, 0.5 and 0.2, not 200 / 600.
        assert_eq!(noop.ratio, Some(0.25));
        assert!(merged[1].skipped);
        assert!(merged[1].rounds.is_empty());
        assert!(merged[1].ratio_rounds.is_empty());
    }

    #[test]
    fn notes_of_rounds_are_kept_once_or_numbered() {
        let noted = |note: Option<&str>| {
            let mut measurement = rate("drain.noop", 100.0, 400.0);
            measurement.note = note.map(str::to_owned);
            measurement
        };
        let same = merge_rounds(vec![
            vec![noted(Some("peak RSS covers the whole process lifetime"))],
            vec![noted(Some("peak RSS covers the whole process lifetime"))],
        ]);
        assert_eq!(
            same[0].note.as_deref(),
            Some("peak RSS covers the whole process lifetime")
        );
        let differing = merge_rounds(vec![
            vec![noted(None)],
            vec![noted(Some("12 redelivered"))],
            vec![noted(Some("3 redelivered"))],
        ]);
        assert_eq!(
            differing[0].note.as_deref(),
            Some("round 2: 12 redelivered; round 3: 3 redelivered")
        );
    }

    #[test]
    fn an_even_number_of_rounds_takes_the_middle_two() {
        let rounds = vec![
            vec![rate("enqueue.batch_1000", 10.0, 20.0)],
            vec![rate("enqueue.batch_1000", 40.0, 20.0)],
        ];
        let merged = merge_rounds(rounds);
        assert_eq!(merged[0].per_second, Some(25.0));
        assert_eq!(
            spread(&merged[0].rounds).as_deref(),
            Some("rounds 10 / 40 msg/s (range 120 % of the median)")
        );
    }

    #[test]
    fn one_round_is_reported_as_it_was() {
        let merged = merge_rounds(vec![vec![rate("drain.noop", 100.0, 400.0)]]);
        assert_eq!(merged[0].per_second, Some(100.0));
        assert!(merged[0].rounds.is_empty());
        assert_eq!(spread(&merged[0].rounds), None);
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1234567.8), "1,234,568");
    }
}
