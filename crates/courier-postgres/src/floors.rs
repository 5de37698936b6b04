//! Claim floors: where each tenant's next claim may start its scan.
//!
//! A claim walks `deliveries_ready` for each tenant in id order. Claimed and
//! completed deliveries leave index entries behind until no snapshot can see
//! them; while some other transaction holds an old snapshot open (a report, a
//! `pg_dump`, a forgotten `BEGIN`), those entries cannot be removed or marked
//! dead, and a claim that starts at the tenant's first entry visits every one
//! of them and its row. Left alone that costs 90 % of the throughput after a
//! few minutes.
//!
//! So the store remembers, per subscription and set of routes (a *lane*) and
//! per tenant, a **floor**: one below the lowest id its last claim of that
//! tenant took, the id above which the next claim scans. Most claims are
//! **floor passes** that serve the tenants the lane knows, each above its
//! floor. **Full passes** (the plain claim: tenants discovered in the index
//! after the cursor, each scanned from its first entry) find what floors
//! skip: deliveries that became claimable below a floor (a retry or rescued
//! lease coming due, a delayed message, a message whose transaction committed
//! after later ones were claimed) and tenants the lane does not know. A run
//! of full passes from the first tenant to the last, each starting where the
//! previous one ended, is a **full lap**. While one is due, the lane runs its
//! full passes one at a time, each continuing the lap (whatever cursor the
//! caller passed), and its other claims use floors. A full lap is due
//!
//! - while the lane has finished none, or one is in progress;
//! - after a worker announced it is idle (it claims once more before it
//!   sleeps, and nothing may be left for the poll): a lap that starts after
//!   the announcement;
//! - when the time since the last lap started reaches [`FULL_PASS_COST_RATIO`]
//!   times what laps cost beyond the floor passes they stood in for (the
//!   median of the last five; a lap within twice its floor passes' time
//!   counts as free, that being how much claims vary anyway). So laps run at
//!   nearly every claim when scanning from the first entries costs little,
//!   and rarely when it costs a lot (under a held snapshot, when a lap walks
//!   millions of entries). What that costs is latency for deliveries below a
//!   floor: up to that interval plus one lap.
//!
//! Two more full passes, outside laps: a floor pass that claims nothing is
//! followed at once by one after the caller's cursor (before the caller is
//! told there is nothing), and so is a claim whose cursor is past every
//! tenant the lane knows.
//!
//! New tenants: each floor pass also lists the tenants with ready deliveries
//! among what was enqueued since the previous floor pass (a primary-key walk
//! above the highest id it saw), so a new tenant is served from the next
//! claim on. A finished lap forgets tenants that have had no ready work for
//! [`FORGET_AFTER`]; until then each floor pass probes them, so a known
//! tenant's next message is claimed at once.
//!
//! Settling a delivery can make work claimable below the floor at once: the
//! next delivery of its ordering key, or the delivery itself when released or
//! failed. Such a settlement lowers its tenant's floor below its id, and a
//! claim planned before the lowering cannot raise the floor past it again.
//! A full pass that serves a tenant but claims nothing of it (every ready
//! delivery delayed, blocked by its ordering key, or the tenant at its
//! in-flight limit) sets its floor to 0.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A full lap is due when the time since the last one started reaches this
/// multiple of its cost beyond floor passes.
pub(crate) const FULL_PASS_COST_RATIO: u32 = 20;

/// However cheap laps are not, one is due at least this often: work below a
/// floor that no mark announces (a delayed message, a message whose
/// transaction committed after later ones were claimed) waits at most this
/// plus one lap.
pub(crate) const MAX_LAP_SPACING: Duration = Duration::from_secs(60);

/// How often a lane reads the database's claim marks (work put back below the
/// floors by any process, see migrations/0009_claim_marks.sql).
pub(crate) const MARK_READ_INTERVAL: Duration = Duration::from_secs(1);

/// A known tenant no full lap or claim has found ready work for in this long
/// is forgotten (found again by the next lap that sees it with work).
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(60);

/// A full pass planned this long ago and never recorded (its claim failed)
/// no longer keeps others from being planned.
const STALE_FULL_PASS: Duration = Duration::from_secs(30);

/// Claimed deliveries tracked for their settlement before the map is dropped
/// (an untracked settlement only leaves a floor where it was).
const MAX_TRACKED: usize = 1 << 16;

/// A lane: claims of one subscription with one set of routes share floors
/// (claims with other routes pass over different rows).
pub(crate) type LaneKey = (String, Vec<(String, i32)>);

/// How one claim scans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Discover tenants after the cursor; scan each from its first entry.
    Full,
    /// Serve these tenants, each from its floor.
    Floor {
        tenants: Vec<String>,
        floors: Vec<i64>,
        /// The cursor for the next claim: the last tenant served when the turn
        /// was full, else empty (the lap is over).
        next_cursor: String,
    },
}

/// A planned claim: how it scans, and the lane's lowering count when planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) pass: Pass,
    pub(crate) epoch: u64,
    /// Floor passes look for tenants with ready deliveries above this id
    /// (0: not at all).
    pub(crate) discover_above: i64,
    /// A full pass of a lap starts after this tenant, not the caller's cursor.
    pub(crate) full_from: Option<String>,
    /// A full pass run because a floor pass found nothing: it scans after
    /// the caller's cursor and is no part of a lap.
    pub(crate) fallback: bool,
}

impl Planned {
    /// The full pass to run after this floor pass found nothing.
    pub(crate) fn fallback(&self) -> Self {
        Self {
            pass: Pass::Full,
            epoch: self.epoch,
            discover_above: 0,
            full_from: None,
            fallback: true,
        }
    }

    /// The cursor the claim scans after, given the caller's.
    pub(crate) fn cursor<'a>(&'a self, callers: &'a str) -> &'a str {
        self.full_from.as_deref().unwrap_or(callers)
    }
}

/// One claimed delivery, as the floors need it.
#[derive(Debug, Clone)]
pub(crate) struct Claimed<'a> {
    pub(crate) id: i64,
    pub(crate) tenant: &'a str,
    pub(crate) ordered: bool,
    /// Priority above 0: taken from deliveries_urgent ahead of the floor
    /// walk, so its id says nothing about where the tenant's priority-0
    /// work starts.
    pub(crate) urgent: bool,
}

/// What a claim found, for [`Floors::record`].
#[derive(Debug, Clone)]
pub(crate) struct Found<'a> {
    /// The cursor the claim started after.
    pub(crate) cursor: &'a str,
    /// The last tenant it served (in the database's order).
    pub(crate) last_tenant: &'a str,
    /// The tenants it served.
    pub(crate) turn: &'a [String],
    /// Whether more tenants may follow the last one served.
    pub(crate) turn_was_full: bool,
    /// What it claimed.
    pub(crate) claimed: &'a [Claimed<'a>],
    /// When it started and how long it took.
    pub(crate) started: Instant,
    pub(crate) took: Duration,
    /// The highest delivery id when it ran.
    pub(crate) max_id: i64,
    /// Tenants with ready deliveries above `discover_above` (floor passes).
    pub(crate) discovered: &'a [String],
}

/// How a claimed delivery was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Completed: only a delivery with an ordering key frees work below it.
    Completed,
    /// Failed (retry or dead letter) or handed back: the row itself, or the
    /// next of its ordering key, may be claimable again.
    Returned,
}

/// A full lap in progress.
#[derive(Debug)]
struct Lap {
    started: Instant,
    took: Duration,
    passes: u32,
    /// The last tenant its passes reached: the next pass starts after it.
    reached: String,
    /// Tenants its passes served.
    seen: HashSet<String>,
}

/// A tenant a lane knows.
#[derive(Debug, Clone, Copy)]
struct Known {
    floor: i64,
    /// When a claim last found it with ready work.
    seen: Instant,
}

#[derive(Debug, Default)]
struct Lane {
    /// Tenants seen with ready work lately, and their floors.
    tenants: BTreeMap<String, Known>,
    /// Start of the last full lap, and what laps cost beyond the floor passes
    /// they stood in for (the median of the last five).
    last_full: Option<(Instant, Duration)>,
    /// A floor pass's duration, smoothed; `None` until one ran.
    floor_cost: Option<Duration>,
    /// What the last few laps cost beyond their floor passes.
    overheads: std::collections::VecDeque<Duration>,
    /// The highest delivery id the last claim saw.
    max_id: i64,
    /// When the full pass now in flight was planned: one at a time, so two
    /// claims in flight do not both walk from the first entries.
    full_in_flight: Option<Instant>,
    /// The full lap in progress, from its pass at the first tenant.
    lap: Option<Lap>,
    /// Laps are due until one that started after this instant finishes.
    full_needed_since: Option<Instant>,
    /// Lowerings so far, and the count at each tenant's last one.
    epoch: u64,
    lowered: HashMap<String, u64>,
    /// When the lane last read the database's claim marks.
    marks_read: Option<Instant>,
}

impl Lane {
    /// Work at `id` of `tenant` may be claimable now: the tenant's floor goes
    /// below it, and a claim planned before this cannot raise it past it.
    fn lower_below(&mut self, tenant: String, id: i64, now: Instant) {
        self.epoch += 1;
        self.lowered.insert(tenant.clone(), self.epoch);
        let below = id.saturating_sub(1);
        let known = self.tenants.entry(tenant).or_insert(Known {
            floor: below,
            seen: now,
        });
        known.floor = known.floor.min(below);
    }
}

#[derive(Debug, Default)]
struct State {
    index: HashMap<LaneKey, usize>,
    lanes: Vec<Lane>,
    /// Claimed deliveries not yet settled: lane, tenant, has an ordering key.
    claimed: HashMap<i64, (usize, String, bool)>,
}

/// Floors of every lane claimed through one store.
#[derive(Debug, Default)]
pub(crate) struct Floors {
    state: Mutex<State>,
    /// Laps are at least this far apart (tests stand in for a held
    /// snapshot's expensive laps with it); zero by default.
    min_lap_spacing: Duration,
}

impl Floors {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the next claim of `lane` after `cursor`, serving at most
    /// `max_tenants` tenants, should scan.
    pub(crate) fn plan(
        &self,
        lane: &LaneKey,
        cursor: &str,
        max_tenants: usize,
        now: Instant,
    ) -> Planned {
        let mut state = self.state();
        let state = &mut *state;
        let Some(lane) = state.index.get(lane).map(|&i| &mut state.lanes[i]) else {
            return Planned {
                pass: Pass::Full,
                epoch: 0,
                discover_above: 0,
                full_from: Some(String::new()),
                fallback: false,
            };
        };
        // A full pass of a lap continues the lap in progress, unless an idle
        // announcement asks for one started after it; else it starts one.
        let continuing = lane.lap.as_ref().filter(|lap| {
            lane.full_needed_since
                .is_none_or(|since| lap.started >= since)
        });
        let full = Planned {
            pass: Pass::Full,
            epoch: lane.epoch,
            discover_above: 0,
            full_from: Some(
                continuing
                    .map(|lap| lap.reached.clone())
                    .unwrap_or_default(),
            ),
            fallback: false,
        };
        let another_in_flight = lane
            .full_in_flight
            .is_some_and(|at| now.saturating_duration_since(at) < STALE_FULL_PASS);
        let due = match lane.last_full {
            None => true,
            Some((started, took)) => {
                lane.full_needed_since.is_some()
                    || lane.lap.is_some()
                    || now.saturating_duration_since(started)
                        >= took
                            .saturating_mul(FULL_PASS_COST_RATIO)
                            .min(MAX_LAP_SPACING)
                            .max(self.min_lap_spacing)
            }
        };
        if due && (!another_in_flight || lane.tenants.is_empty()) {
            lane.full_in_flight = Some(now);
            return full;
        }
        let after = if cursor.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(cursor)
        };
        let max_tenants = max_tenants.max(1);
        let (tenants, floors): (Vec<String>, Vec<i64>) = lane
            .tenants
            .range::<str, _>((after, Bound::Unbounded))
            .take(max_tenants)
            .map(|(tenant, known)| (tenant.clone(), known.floor))
            .unzip();
        if tenants.is_empty() {
            // No known tenant after the caller's cursor: look there.
            return Planned {
                pass: Pass::Full,
                epoch: lane.epoch,
                discover_above: 0,
                full_from: None,
                fallback: true,
            };
        }
        let next_cursor = if tenants.len() >= max_tenants {
            tenants.last().cloned().unwrap_or_default()
        } else {
            String::new()
        };
        Planned {
            pass: Pass::Floor {
                tenants,
                floors,
                next_cursor,
            },
            epoch: lane.epoch,
            discover_above: lane.max_id,
            full_from: None,
            fallback: false,
        }
    }

    /// Records what a claim planned as `planned` found.
    pub(crate) fn record(&self, key: &LaneKey, planned: &Planned, found: &Found<'_>) {
        let mut state = self.state();
        let state = &mut *state;
        let index = match state.index.get(key) {
            Some(&i) => i,
            None => {
                state.lanes.push(Lane::default());
                let i = state.lanes.len() - 1;
                state.index.insert(key.clone(), i);
                i
            }
        };
        let lane = &mut state.lanes[index];
        let full = planned.pass == Pass::Full;
        let mut lowest: BTreeMap<&str, i64> = BTreeMap::new();
        // Floors bound the priority-0 walk only: an urgent delivery is newer
        // than most of its tenant's backlog, and a floor just below it would
        // skip that backlog.
        for c in found.claimed.iter().filter(|c| !c.urgent) {
            lowest
                .entry(c.tenant)
                .and_modify(|low| *low = (*low).min(c.id))
                .or_insert(c.id);
        }
        // Tenants enqueued for since the last claim: everything of theirs
        // above that claim's highest id is still to scan.
        for tenant in found.discovered {
            lane.tenants.entry(tenant.clone()).or_insert(Known {
                floor: planned.discover_above,
                seen: found.started,
            });
        }
        // Only floor passes move the discovery mark (a full pass after some
        // cursor has not looked at the tenants before it); a full pass seeds it.
        if !full || lane.max_id == 0 {
            lane.max_id = lane.max_id.max(found.max_id);
        }
        // Every tenant a claim served had ready work.
        for tenant in found.turn {
            let known = lane.tenants.entry(tenant.clone()).or_insert(Known {
                floor: 0,
                seen: found.started,
            });
            known.seen = known.seen.max(found.started);
            if full && !lowest.contains_key(tenant.as_str()) {
                // Served and scanned from its first entry, but nothing
                // claimed: its ready work is delayed, blocked or over its
                // limit, and may become claimable anywhere.
                known.floor = 0;
            }
        }
        for (tenant, low) in &lowest {
            let proposed = low.saturating_sub(1);
            let lowered_since = lane
                .lowered
                .get(*tenant)
                .is_some_and(|&at| at > planned.epoch);
            let known = lane.tenants.entry((*tenant).to_owned()).or_insert(Known {
                floor: 0,
                seen: found.started,
            });
            known.floor = if lowered_since {
                known.floor.min(proposed)
            } else if full {
                // Everything claimable below the lowest claimed id was taken.
                proposed
            } else {
                known.floor.max(proposed)
            };
        }
        if !full {
            lane.floor_cost = Some(match lane.floor_cost {
                Some(cost) => cost.saturating_mul(4).saturating_add(found.took) / 5,
                None => found.took,
            });
        }
        if full && !planned.fallback {
            lane.full_in_flight = None;
            if found.cursor.is_empty() {
                // A lap starts at the first tenant (a new one replaces any
                // lap that did not finish).
                lane.lap = Some(Lap {
                    started: found.started,
                    took: Duration::ZERO,
                    passes: 0,
                    reached: String::new(),
                    seen: HashSet::new(),
                });
            }
            // A pass counts for the lap only if it starts where the lap's
            // last pass ended, so a finished lap has seen every tenant.
            let finished = match lane.lap.as_mut() {
                Some(lap) if lap.reached == found.cursor => {
                    lap.took = lap.took.saturating_add(found.took);
                    lap.passes = lap.passes.saturating_add(1);
                    lap.seen.extend(found.turn.iter().cloned());
                    if found.turn_was_full {
                        found.last_tenant.clone_into(&mut lap.reached);
                        false
                    } else {
                        true
                    }
                }
                _ => false,
            };
            if finished {
                if let Some(lap) = lane.lap.take() {
                    // Tenants the lap did not serve had no ready work; those
                    // that had none for a while are forgotten. (Kept ones
                    // cost a cheap probe per floor pass and find their next
                    // delivery at once.)
                    let now = found.started + found.took;
                    lane.tenants.retain(|tenant, known| {
                        lap.seen.contains(tenant)
                            || now.saturating_duration_since(known.seen) < FORGET_AFTER
                    });
                    let tenants = &lane.tenants;
                    lane.lowered
                        .retain(|tenant, _| tenants.contains_key(tenant));
                    if lane
                        .full_needed_since
                        .is_some_and(|since| lap.started >= since)
                    {
                        lane.full_needed_since = None;
                    }
                    if lane.last_full.is_none_or(|(last, _)| lap.started >= last) {
                        // What scanning from the first entries added: about
                        // nothing normally (laps then run nearly every
                        // claim), the walk past kept entries under a held
                        // snapshot. Until a floor pass ran, all of it.
                        let floor_passes = lane
                            .floor_cost
                            .map(|floor| floor.saturating_mul(lap.passes));
                        let overhead = match floor_passes {
                            // Within twice what floor passes would have
                            // taken is noise (claim times vary that much):
                            // laps cost nothing worth spacing out.
                            Some(floor) if lap.took <= floor.saturating_mul(2) => Duration::ZERO,
                            Some(floor) => lap.took.saturating_sub(floor),
                            None => lap.took,
                        };
                        // The median of the last five, so one slow lap (a
                        // stalled flush, a busy core) does not hold the
                        // next ones back.
                        if lane.overheads.len() == 5 {
                            lane.overheads.pop_front();
                        }
                        lane.overheads.push_back(overhead);
                        let mut recent: Vec<Duration> = lane.overheads.iter().copied().collect();
                        recent.sort_unstable();
                        let median = recent
                            .get(recent.len().saturating_sub(1) / 2)
                            .copied()
                            .unwrap_or(overhead);
                        tracing::debug!(
                            subscription = key.0,
                            passes = lap.passes,
                            took_us = lap.took.as_micros(),
                            floor_pass_us = lane.floor_cost.map(|c| c.as_micros()),
                            overhead_us = overhead.as_micros(),
                            "full lap done"
                        );
                        lane.last_full = Some((lap.started, median));
                    }
                }
            }
        }
        if state.claimed.len() + found.claimed.len() > MAX_TRACKED {
            state.claimed.clear();
        }
        for c in found.claimed {
            state
                .claimed
                .insert(c.id, (index, c.tenant.to_owned(), c.ordered));
        }
    }

    /// A claim planned as a full pass failed before it could be recorded.
    pub(crate) fn abandon(&self, key: &LaneKey, planned: &Planned) {
        if planned.pass != Pass::Full {
            return;
        }
        let mut state = self.state();
        let state = &mut *state;
        if let Some(&i) = state.index.get(key) {
            state.lanes[i].full_in_flight = None;
        }
    }

    /// Notes that these claimed deliveries were settled as `how`, lowering
    /// the floor where that may have made work claimable below it.
    pub(crate) fn settled(&self, ids: impl IntoIterator<Item = i64>, how: Settled) {
        let mut state = self.state();
        let state = &mut *state;
        for id in ids {
            let Some((lane, tenant, ordered)) = state.claimed.remove(&id) else {
                continue;
            };
            if how == Settled::Completed && !ordered {
                continue;
            }
            state.lanes[lane].lower_below(tenant, id, Instant::now());
        }
    }

    /// Floors whose laps are at least `spacing` apart.
    pub(crate) fn with_min_lap_spacing(spacing: Duration) -> Self {
        Self {
            state: Mutex::default(),
            min_lap_spacing: spacing,
        }
    }

    /// Whether `key`'s lane should read the claim marks now: a lane that
    /// exists and has not read them for [`MARK_READ_INTERVAL`]. Counts as
    /// the read.
    pub(crate) fn marks_due(&self, key: &LaneKey, now: Instant) -> bool {
        let mut state = self.state();
        let state = &mut *state;
        let Some(&i) = state.index.get(key) else {
            return false;
        };
        let lane = &mut state.lanes[i];
        let due = lane
            .marks_read
            .is_none_or(|at| now.saturating_duration_since(at) >= MARK_READ_INTERVAL);
        if due {
            lane.marks_read = Some(now);
        }
        due
    }

    /// Lowers `key`'s floors below the marked deliveries `lows` (tenant,
    /// lowest marked id), as a settlement in this process would.
    pub(crate) fn lower(&self, key: &LaneKey, lows: &[(String, i64)], now: Instant) {
        let mut state = self.state();
        let state = &mut *state;
        let Some(&i) = state.index.get(key) else {
            return;
        };
        let lane = &mut state.lanes[i];
        for (tenant, low) in lows {
            lane.lower_below(tenant.clone(), *low, now);
            if let Some(known) = lane.tenants.get_mut(tenant) {
                // It has work waiting: not to be forgotten.
                known.seen = known.seen.max(now);
            }
        }
    }

    /// The floors of `subscription`'s tenants (the lowest over its lanes).
    pub(crate) fn of(&self, subscription: &str) -> BTreeMap<String, i64> {
        let state = self.state();
        let mut floors = BTreeMap::new();
        for (key, &i) in &state.index {
            if key.0 != subscription {
                continue;
            }
            for (tenant, known) in &state.lanes[i].tenants {
                floors
                    .entry(tenant.clone())
                    .and_modify(|f: &mut i64| *f = (*f).min(known.floor))
                    .or_insert(known.floor);
            }
        }
        floors
    }

    /// Every lane of `subscription` needs a full lap that starts after `now`:
    /// a worker announced it is idle and claims once more before it sleeps.
    pub(crate) fn need_full_pass(&self, subscription: &str, now: Instant) {
        let mut state = self.state();
        let state = &mut *state;
        for (key, &i) in &state.index {
            if key.0 == subscription {
                state.lanes[i].full_needed_since = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane() -> LaneKey {
        ("billing".into(), vec![("orders".into(), 1)])
    }

    fn claimed<'a>(tenant: &'a str, ids: &[i64]) -> Vec<Claimed<'a>> {
        ids.iter()
            .map(|&id| Claimed {
                id,
                tenant,
                ordered: false,
                urgent: false,
            })
            .collect()
    }

    fn names(tenants: &[&str]) -> Vec<String> {
        tenants.iter().map(|t| (*t).to_owned()).collect()
    }

    /// Records a claim from the start of the tenants whose turn was tenant
    /// "a" alone and which took one row, `id`: the common case of these tests.
    fn claim_a(floors: &Floors, planned: &Planned, id: i64, started: Instant, took: Duration) {
        claim(
            floors,
            planned,
            "",
            &["a"],
            false,
            &claimed("a", &[id]),
            started,
            took,
        );
    }

    /// Records a claim planned now.
    #[allow(clippy::too_many_arguments)]
    fn claim(
        floors: &Floors,
        planned: &Planned,
        cursor: &str,
        turn: &[&str],
        turn_was_full: bool,
        rows: &[Claimed<'_>],
        started: Instant,
        took: Duration,
    ) {
        let turn = names(turn);
        let last_tenant = turn.last().cloned().unwrap_or_default();
        floors.record(
            &lane(),
            planned,
            &Found {
                cursor,
                last_tenant: &last_tenant,
                turn: &turn,
                turn_was_full,
                claimed: rows,
                started,
                took,
                max_id: 0,
                discovered: &[],
            },
        );
    }

    fn floors_of(floors: &Floors, now: Instant) -> (Vec<String>, Vec<i64>) {
        match floors.plan(&lane(), "", 100, now).pass {
            Pass::Floor {
                tenants, floors, ..
            } => (tenants, floors),
            Pass::Full => panic!("expected a floor pass"),
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_lane_starts_with_a_full_pass_and_then_claims_from_floors() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let first = floors.plan(&lane(), "", 10, t0);
        assert_eq!(first.pass, Pass::Full);
        let rows = [claimed("a", &[5, 6, 7]), claimed("b", &[9])].concat();
        claim(
            &floors,
            &first,
            "",
            &["a", "b"],
            false,
            &rows,
            t0,
            Duration::from_millis(5),
        );
        let next = floors.plan(&lane(), "", 10, t0 + Duration::from_millis(10));
        assert_eq!(
            next.pass,
            Pass::Floor {
                tenants: names(&["a", "b"]),
                floors: vec![4, 8],
                next_cursor: String::new(),
            }
        );
        // A floor pass only raises floors.
        let rows = [claimed("a", &[3, 20]), claimed("b", &[30])].concat();
        claim(
            &floors,
            &next,
            "",
            &["a"],
            false,
            &rows,
            t0,
            Duration::from_millis(1),
        );
        assert_eq!(
            floors_of(&floors, t0 + Duration::from_millis(20)).1,
            vec![4, 29]
        );
    }

    #[test]
    fn an_urgent_delivery_does_not_raise_its_tenant_s_floor() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let first = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &first,
            "",
            &["a"],
            false,
            &claimed("a", &[5]),
            t0,
            Duration::from_millis(5),
        );
        let next = floors.plan(&lane(), "", 10, t0 + Duration::from_millis(10));
        assert!(matches!(next.pass, Pass::Floor { .. }));
        // The floor pass took only a priority-9 delivery enqueued after a
        // backlog (ids 6 to 99): a floor at 99 would skip the backlog.
        let urgent = [Claimed {
            id: 100,
            tenant: "a",
            ordered: false,
            urgent: true,
        }];
        claim(
            &floors,
            &next,
            "",
            &["a"],
            false,
            &urgent,
            t0,
            Duration::from_millis(1),
        );
        assert_eq!(
            floors_of(&floors, t0 + Duration::from_millis(20)).1,
            vec![4]
        );
        // Beside priority-0 rows, those set it as before.
        let later = floors.plan(&lane(), "", 10, t0 + Duration::from_millis(30));
        let mixed = [
            Claimed {
                id: 101,
                tenant: "a",
                ordered: false,
                urgent: true,
            },
            Claimed {
                id: 6,
                tenant: "a",
                ordered: false,
                urgent: false,
            },
        ];
        claim(
            &floors,
            &later,
            "",
            &["a"],
            false,
            &mixed,
            t0,
            Duration::from_millis(1),
        );
        assert_eq!(
            floors_of(&floors, t0 + Duration::from_millis(40)).1,
            vec![5]
        );
    }

    #[test]
    fn full_laps_recur_at_a_bounded_share_of_the_time() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_millis(100);
        let first = floors.plan(&lane(), "", 10, t0);
        claim_a(&floors, &first, 1, t0, took);
        let just_before = t0 + took * FULL_PASS_COST_RATIO - Duration::from_millis(1);
        assert!(matches!(
            floors.plan(&lane(), "", 10, just_before).pass,
            Pass::Floor { .. }
        ));
        assert_eq!(
            floors
                .plan(&lane(), "", 10, t0 + took * FULL_PASS_COST_RATIO)
                .pass,
            Pass::Full
        );
    }

    #[test]
    fn a_full_lap_runs_from_the_first_tenant_to_the_last() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 2, t0);
        // A full pass from a cursor does not start the lap; one from the
        // first tenant does, and every claim is a full pass until one ends it.
        claim(&floors, &full, "m", &["n", "o"], true, &[], t0, SECOND);
        claim(&floors, &full, "", &["p"], true, &[], t0, SECOND);
        let t1 = t0 + FORGET_AFTER;
        assert_eq!(floors.plan(&lane(), "o", 2, t1).pass, Pass::Full);
        let rows = claimed("a", &[1]);
        claim(&floors, &full, "", &["a", "b"], true, &rows, t1, SECOND);
        assert_eq!(floors.plan(&lane(), "b", 2, t1).pass, Pass::Full);
        let rows = claimed("c", &[3]);
        claim(&floors, &full, "b", &["c", "o"], false, &rows, t1, SECOND);
        // Done: tenants it did not serve and no claim found with work for a
        // minute are forgotten (n, p; o was just served), and the next lap
        // is due 20 × its 2 s after it started.
        let (tenants, _) = floors_of(&floors, t1 + SECOND);
        assert_eq!(tenants, names(&["a", "b", "c", "o"]));
        let due = t1 + 2 * SECOND * FULL_PASS_COST_RATIO;
        let before = floors.plan(&lane(), "", 2, due - SECOND).pass;
        assert!(matches!(before, Pass::Floor { .. }));
        assert_eq!(floors.plan(&lane(), "", 2, due).pass, Pass::Full);
    }

    #[test]
    fn a_floor_pass_learns_of_tenants_enqueued_for_since_the_last_claim() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let first = floors.plan(&lane(), "", 10, t0);
        assert_eq!(first.discover_above, 0, "a full pass discovers by itself");
        let rows = claimed("a", &[1]);
        let found = Found {
            cursor: "",
            last_tenant: "a",
            turn: &names(&["a"]),
            turn_was_full: false,
            claimed: &rows,
            started: t0,
            took: SECOND,
            max_id: 100,
            discovered: &[],
        };
        floors.record(&lane(), &first, &found);
        let floor_pass = floors.plan(&lane(), "", 10, t0);
        assert_eq!(floor_pass.discover_above, 100);
        let found = Found {
            max_id: 180,
            discovered: &names(&["a", "new"]),
            claimed: &[],
            ..found
        };
        floors.record(&lane(), &floor_pass, &found);
        // "new" is served from the next claim, above the id the previous one saw.
        assert_eq!(floors_of(&floors, t0), (names(&["a", "new"]), vec![0, 100]));
        assert_eq!(floors.plan(&lane(), "", 10, t0).discover_above, 180);
    }

    #[test]
    fn a_lap_counts_only_passes_that_follow_on_from_each_other() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 2, t0);
        claim(
            &floors,
            &full,
            "",
            &["a", "b"],
            true,
            &claimed("a", &[1]),
            t0,
            SECOND,
        );
        // The lap's next pass starts after "b", whatever the caller's cursor.
        let next = floors.plan(&lane(), "x", 2, t0);
        assert_eq!((next.pass.clone(), next.cursor("x")), (Pass::Full, "b"));
        // Full passes from elsewhere neither end nor extend it: a fallback
        // after an empty floor pass, or one not starting where the lap got to.
        let fallback = next.fallback();
        assert_eq!(fallback.cursor("x"), "x");
        claim(
            &floors,
            &fallback,
            "x",
            &["y"],
            false,
            &claimed("y", &[9]),
            t0,
            SECOND,
        );
        claim(
            &floors,
            &next,
            "q",
            &["r"],
            false,
            &claimed("r", &[7]),
            t0,
            SECOND,
        );
        let next = floors.plan(&lane(), "x", 2, t0);
        assert_eq!((next.pass.clone(), next.cursor("x")), (Pass::Full, "b"));
        claim(
            &floors,
            &next,
            "b",
            &["c"],
            false,
            &claimed("c", &[3]),
            t0,
            SECOND,
        );
        // Done: floors again.
        assert!(matches!(
            floors.plan(&lane(), "", 2, t0).pass,
            Pass::Floor { .. }
        ));
    }

    #[test]
    fn a_tenant_without_ready_work_is_kept_for_a_while() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &full,
            "",
            &["a", "b"],
            false,
            &claimed("a", &[1]),
            t0,
            SECOND,
        );
        // A lap later finds only "a" with work: "b" stays known (its next
        // message is found by the next floor pass) until a minute passes.
        let soon = t0 + 10 * SECOND;
        claim_a(&floors, &full, 5, soon, SECOND);
        assert_eq!(floors_of(&floors, soon + SECOND).0, names(&["a", "b"]));
        let late = t0 + FORGET_AFTER + SECOND;
        claim_a(&floors, &full, 9, late, SECOND);
        assert_eq!(floors_of(&floors, late + SECOND).0, names(&["a"]));
    }

    #[test]
    fn laps_are_spaced_by_what_they_cost_beyond_floor_passes() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let first = floors.plan(&lane(), "", 10, t0);
        claim_a(&floors, &first, 1, t0, 10 * ms);
        let floor_pass = floors.plan(&lane(), "", 10, t0 + ms);
        assert!(matches!(floor_pass.pass, Pass::Floor { .. }));
        claim_a(&floors, &floor_pass, 2, t0, 9 * ms);
        // The first lap's 10 ms counted whole (no floor pass to compare
        // with yet): due 200 ms after it started.
        assert!(matches!(
            floors.plan(&lane(), "", 10, t0 + 199 * ms).pass,
            Pass::Floor { .. }
        ));
        let t1 = t0 + 200 * ms;
        let lap = floors.plan(&lane(), "", 10, t1);
        assert_eq!(lap.pass, Pass::Full);
        // One full pass at a time: a second claim meanwhile uses floors.
        assert!(matches!(
            floors.plan(&lane(), "", 10, t1).pass,
            Pass::Floor { .. }
        ));
        // 10 ms where a floor pass takes 9 is noise: laps cost nothing now,
        // and the next is due at once.
        claim_a(&floors, &lap, 3, t1, 10 * ms);
        let t2 = t1 + 10 * ms;
        let lap = floors.plan(&lane(), "", 10, t2);
        assert_eq!(lap.pass, Pass::Full);
        // One slow lap (91 ms over) does not hold the next back: the median
        // of the recent ones (0, 10, 91 ms) is 10 ms.
        claim_a(&floors, &lap, 4, t2, 100 * ms);
        let due = t2 + 200 * ms;
        assert!(matches!(
            floors.plan(&lane(), "", 10, due - ms).pass,
            Pass::Floor { .. }
        ));
        assert_eq!(floors.plan(&lane(), "", 10, due).pass, Pass::Full);
    }

    #[test]
    fn an_idle_announcement_asks_for_a_full_lap_started_after_it() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 10, t0);
        claim_a(&floors, &full, 1, t0, SECOND);
        let announced = t0 + Duration::from_millis(50);
        floors.need_full_pass("billing", announced);
        assert_eq!(floors.plan(&lane(), "", 10, announced).pass, Pass::Full);
        // A lap that started before the announcement does not count.
        claim_a(&floors, &full, 2, t0, SECOND);
        assert_eq!(floors.plan(&lane(), "", 10, announced).pass, Pass::Full);
        claim_a(&floors, &full, 3, announced, SECOND);
        assert!(matches!(
            floors.plan(&lane(), "", 10, announced).pass,
            Pass::Floor { .. }
        ));
        // Another subscription's announcement changes nothing here.
        floors.need_full_pass("shipping", announced);
        assert!(matches!(
            floors.plan(&lane(), "", 10, announced).pass,
            Pass::Floor { .. }
        ));
    }

    #[test]
    fn a_tenant_served_by_a_full_pass_without_a_claim_is_scanned_from_its_start() {
        // Its ready work is delayed, blocked or over its in-flight limit; it
        // may become claimable below any floor.
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &full,
            "",
            &["a", "b"],
            false,
            &claimed("a", &[50]),
            t0,
            SECOND,
        );
        let floor_pass = floors.plan(&lane(), "", 10, t0);
        let quick = Duration::from_millis(1);
        claim(
            &floors,
            &floor_pass,
            "",
            &["b"],
            false,
            &claimed("b", &[70]),
            t0,
            quick,
        );
        assert_eq!(floors_of(&floors, t0).1, vec![49, 69]);
        let full = Planned {
            pass: Pass::Full,
            epoch: 0,
            discover_above: 0,
            full_from: Some(String::new()),
            fallback: false,
        };
        claim(
            &floors,
            &full,
            "",
            &["a", "b"],
            false,
            &claimed("a", &[60]),
            t0,
            SECOND,
        );
        assert_eq!(floors_of(&floors, t0).1, vec![59, 0]);
    }

    #[test]
    fn a_floor_turn_follows_the_cursor_and_ends_the_lap_when_short() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let full = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &full,
            "",
            &["a", "b", "c"],
            false,
            &claimed("a", &[1]),
            t0,
            SECOND,
        );
        let Pass::Floor {
            tenants,
            next_cursor,
            ..
        } = floors.plan(&lane(), "", 2, t0).pass
        else {
            panic!("expected a floor pass");
        };
        assert_eq!((tenants, next_cursor.as_str()), (names(&["a", "b"]), "b"));
        let Pass::Floor {
            tenants,
            next_cursor,
            ..
        } = floors.plan(&lane(), "b", 2, t0).pass
        else {
            panic!("expected a floor pass");
        };
        assert_eq!((tenants, next_cursor.as_str()), (names(&["c"]), ""));
        // Past the last known tenant: discover.
        assert_eq!(floors.plan(&lane(), "c", 2, t0).pass, Pass::Full);
    }

    #[test]
    fn settlements_that_free_work_below_the_floor_lower_it() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let rows = vec![
            Claimed {
                id: 10,
                tenant: "a",
                ordered: true,
                urgent: false,
            },
            Claimed {
                id: 11,
                tenant: "a",
                ordered: false,
                urgent: false,
            },
            Claimed {
                id: 12,
                tenant: "a",
                ordered: false,
                urgent: false,
            },
        ];
        let full = floors.plan(&lane(), "", 10, t0);
        claim(&floors, &full, "", &["a"], false, &rows, t0, SECOND);
        let floor_of = || floors_of(&floors, t0).1[0];
        // Later claims moved the floor up.
        let planned = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &planned,
            "",
            &[],
            false,
            &claimed("a", &[40]),
            t0,
            SECOND,
        );
        assert_eq!(floor_of(), 39);
        // An unordered completion frees nothing.
        floors.settled([11], Settled::Completed);
        assert_eq!(floor_of(), 39);
        // A failed (to be retried) delivery comes back below the floor.
        floors.settled([12], Settled::Returned);
        assert_eq!(floor_of(), 11);
        // The next message of an ordering key lies above its completed head.
        // A claim planned before that lowering cannot raise the floor again.
        let in_flight = floors.plan(&lane(), "", 10, t0);
        floors.settled([10], Settled::Completed);
        assert_eq!(floor_of(), 9);
        claim(
            &floors,
            &in_flight,
            "",
            &[],
            false,
            &claimed("a", &[60]),
            t0,
            SECOND,
        );
        assert_eq!(floor_of(), 9);
        // A claim planned after it can; a second report of the same
        // settlement is ignored.
        let later = floors.plan(&lane(), "", 10, t0);
        claim(
            &floors,
            &later,
            "",
            &[],
            false,
            &claimed("a", &[50]),
            t0,
            SECOND,
        );
        floors.settled([10], Settled::Completed);
        assert_eq!(floor_of(), 49);
    }
}
