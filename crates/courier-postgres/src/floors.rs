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
//! per tenant, a **floor**: an id at or below which its last claim left only
//! deliveries that were claimed, completed or not claimable. Most claims are
//! **floor passes** that serve the tenants the lane knows, each from its floor.
//! A **full pass** (the plain claim: tenants discovered in the index, each
//! scanned from its first entry) finds what floors skip: deliveries that became
//! claimable below a floor (a retry or rescued lease coming due, a delayed
//! message, a message whose transaction committed after later ones were
//! claimed) and tenants seen for the first time. A full pass runs
//!
//! - when the lane has no floors yet, or knows no tenant after the cursor;
//! - on the first claim after a worker announced it is idle, so nothing is
//!   left waiting for the poll interval;
//! - whenever the time since the last full pass started is at least
//!   [`FULL_PASS_COST_RATIO`] times what that pass took.
//!
//! The last rule keeps full passes at a bounded share of the claim time: a few
//! milliseconds every few tens of milliseconds normally, and under a held
//! snapshot, when a full pass walks millions of entries, rarely enough that
//! throughput holds. What it costs is latency for deliveries below a floor, at
//! most that interval.
//!
//! A settled delivery can make work claimable below the floor at once: the
//! next delivery of its ordering key, or itself when released or failed. So a
//! settlement of such a delivery lowers its tenant's floor below its id.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A full pass runs when the time since the last one started reaches this
/// multiple of its duration.
pub(crate) const FULL_PASS_COST_RATIO: u32 = 20;

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

/// One claimed delivery, as the floors need it.
#[derive(Debug, Clone)]
pub(crate) struct Claimed<'a> {
    pub(crate) id: i64,
    pub(crate) tenant: &'a str,
    pub(crate) ordered: bool,
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

#[derive(Debug, Default)]
struct Lane {
    /// Tenants seen with ready work, and their floors.
    tenants: BTreeMap<String, i64>,
    /// Start and duration of the last full pass.
    last_full: Option<(Instant, Duration)>,
    /// A full pass must start after this instant before floors are used again.
    full_needed_since: Option<Instant>,
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
    ) -> Pass {
        let state = self.state();
        let Some(lane) = state.index.get(lane).map(|&i| &state.lanes[i]) else {
            return Pass::Full;
        };
        let Some((started, took)) = lane.last_full else {
            return Pass::Full;
        };
        if lane.full_needed_since.is_some()
            || now.saturating_duration_since(started) >= took * FULL_PASS_COST_RATIO
        {
            return Pass::Full;
        }
        let after = if cursor.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(cursor)
        };
        let (tenants, floors): (Vec<String>, Vec<i64>) = lane
            .tenants
            .range::<str, _>((after, Bound::Unbounded))
            .take(max_tenants.max(1))
            .map(|(tenant, floor)| (tenant.clone(), *floor))
            .unzip();
        if tenants.is_empty() {
            return Pass::Full;
        }
        let next_cursor = if tenants.len() >= max_tenants.max(1) {
            tenants.last().cloned().unwrap_or_default()
        } else {
            String::new()
        };
        Pass::Floor {
            tenants,
            floors,
            next_cursor,
        }
    }

    /// Records what a claim planned as `pass` found. `turn` is the tenants it
    /// served; for a full pass, `turn_was_full` says whether more tenants may
    /// follow the last one (so tenants known after it were not looked at).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        key: &LaneKey,
        pass: &Pass,
        cursor: &str,
        turn: &[String],
        turn_was_full: bool,
        claimed: &[Claimed<'_>],
        started: Instant,
        took: Duration,
    ) {
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
        let mut lowest: BTreeMap<&str, i64> = BTreeMap::new();
        for c in claimed {
            lowest
                .entry(c.tenant)
                .and_modify(|low| *low = (*low).min(c.id))
                .or_insert(c.id);
        }
        if *pass == Pass::Full {
            // A pass over every tenant (from the first, and not cut short)
            // saw all with ready work: forget the others. (Only then: the
            // database may order tenants differently from this map.)
            if cursor.is_empty() && !turn_was_full {
                lane.tenants.retain(|tenant, _| turn.contains(tenant));
            }
            for tenant in turn {
                // Scanned from its first entry: everything claimable below
                // the lowest claimed id was claimed.
                let floor = match lowest.get(tenant.as_str()) {
                    Some(low) => low - 1,
                    None => lane.tenants.get(tenant).copied().unwrap_or(0),
                };
                lane.tenants.insert(tenant.clone(), floor);
            }
            let superseded = lane.full_needed_since.is_some_and(|since| started >= since);
            if superseded {
                lane.full_needed_since = None;
            }
            if lane.last_full.is_none_or(|(last, _)| started >= last) {
                lane.last_full = Some((started, took));
            }
        } else {
            for (tenant, low) in &lowest {
                if let Some(floor) = lane.tenants.get_mut(*tenant) {
                    *floor = (*floor).max(low - 1);
                }
            }
        }
        if state.claimed.len() + claimed.len() > MAX_TRACKED {
            state.claimed.clear();
        }
        for c in claimed {
            state
                .claimed
                .insert(c.id, (index, c.tenant.to_owned(), c.ordered));
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
            let floor = state.lanes[lane].tenants.entry(tenant).or_insert(id - 1);
            *floor = (*floor).min(id - 1);
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
            for (tenant, &floor) in &state.lanes[i].tenants {
                floors
                    .entry(tenant.clone())
                    .and_modify(|f: &mut i64| *f = (*f).min(floor))
                    .or_insert(floor);
            }
        }
        floors
    }

    /// The next claim of every lane of `subscription` must be a full pass:
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
            })
            .collect()
    }

    fn turn(tenants: &[&str]) -> Vec<String> {
        tenants.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn a_lane_starts_with_a_full_pass_and_then_claims_from_floors() {
        let floors = Floors::default();
        let t0 = Instant::now();
        assert_eq!(floors.plan(&lane(), "", 10, t0), Pass::Full);
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a", "b"]),
            false,
            &[claimed("a", &[5, 6, 7]), claimed("b", &[9])].concat(),
            t0,
            Duration::from_millis(5),
        );
        let plan = floors.plan(&lane(), "", 10, t0 + Duration::from_millis(10));
        assert_eq!(
            plan,
            Pass::Floor {
                tenants: turn(&["a", "b"]),
                floors: vec![4, 8],
                next_cursor: String::new(),
            }
        );
        // A floor pass only raises floors.
        floors.record(
            &lane(),
            &plan,
            "",
            &turn(&["a"]),
            false,
            &[claimed("a", &[3, 20]), claimed("b", &[30])].concat(),
            t0,
            Duration::from_millis(1),
        );
        let Pass::Floor { floors: f, .. } =
            floors.plan(&lane(), "", 10, t0 + Duration::from_millis(20))
        else {
            panic!("expected a floor pass");
        };
        assert_eq!(f, vec![4, 29]);
    }

    #[test]
    fn full_passes_recur_at_a_bounded_share_of_the_time() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_millis(100);
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a"]),
            false,
            &claimed("a", &[1]),
            t0,
            took,
        );
        let just_before = t0 + took * FULL_PASS_COST_RATIO - Duration::from_millis(1);
        assert!(matches!(
            floors.plan(&lane(), "", 10, just_before),
            Pass::Floor { .. }
        ));
        assert_eq!(
            floors.plan(&lane(), "", 10, t0 + took * FULL_PASS_COST_RATIO),
            Pass::Full
        );
    }

    #[test]
    fn an_idle_announcement_asks_for_a_full_pass_started_after_it() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_secs(1);
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a"]),
            false,
            &[],
            t0,
            took,
        );
        let announced = t0 + Duration::from_millis(50);
        floors.need_full_pass("billing", announced);
        assert_eq!(floors.plan(&lane(), "", 10, announced), Pass::Full);
        // A full pass that started before the announcement does not count.
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a"]),
            false,
            &[],
            t0,
            took,
        );
        assert_eq!(floors.plan(&lane(), "", 10, announced), Pass::Full);
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a"]),
            false,
            &[],
            announced,
            took,
        );
        assert!(matches!(
            floors.plan(&lane(), "", 10, announced),
            Pass::Floor { .. }
        ));
        // Another subscription's announcement changes nothing here.
        floors.need_full_pass("shipping", announced);
        assert!(matches!(
            floors.plan(&lane(), "", 10, announced),
            Pass::Floor { .. }
        ));
    }

    #[test]
    fn a_full_pass_over_every_tenant_forgets_those_without_ready_work() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_secs(1);
        let known = |floors: &Floors| match floors.plan(&lane(), "", 10, t0) {
            Pass::Floor { tenants, .. } => tenants,
            Pass::Full => panic!("expected a floor pass"),
        };
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a", "b", "c", "d"]),
            false,
            &[],
            t0,
            took,
        );
        // A pass cut short, or one after a cursor, did not look at every tenant.
        floors.record(&lane(), &Pass::Full, "", &turn(&["c"]), true, &[], t0, took);
        floors.record(
            &lane(),
            &Pass::Full,
            "a",
            &turn(&["c"]),
            false,
            &[],
            t0,
            took,
        );
        assert_eq!(known(&floors), turn(&["a", "b", "c", "d"]));
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["c", "a"]),
            false,
            &[],
            t0,
            took,
        );
        assert_eq!(known(&floors), turn(&["a", "c"]));
    }

    #[test]
    fn a_floor_turn_follows_the_cursor_and_ends_the_lap_when_short() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_secs(1);
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a", "b", "c"]),
            false,
            &[],
            t0,
            took,
        );
        let Pass::Floor {
            tenants,
            next_cursor,
            ..
        } = floors.plan(&lane(), "", 2, t0)
        else {
            panic!("expected a floor pass");
        };
        assert_eq!((tenants, next_cursor.as_str()), (turn(&["a", "b"]), "b"));
        let Pass::Floor {
            tenants,
            next_cursor,
            ..
        } = floors.plan(&lane(), "b", 2, t0)
        else {
            panic!("expected a floor pass");
        };
        assert_eq!((tenants, next_cursor.as_str()), (turn(&["c"]), ""));
        // Past the last known tenant: discover.
        assert_eq!(floors.plan(&lane(), "c", 2, t0), Pass::Full);
    }

    #[test]
    fn settlements_that_free_work_below_the_floor_lower_it() {
        let floors = Floors::default();
        let t0 = Instant::now();
        let took = Duration::from_secs(1);
        let rows = vec![
            Claimed {
                id: 10,
                tenant: "a",
                ordered: true,
            },
            Claimed {
                id: 11,
                tenant: "a",
                ordered: false,
            },
            Claimed {
                id: 12,
                tenant: "a",
                ordered: false,
            },
        ];
        floors.record(
            &lane(),
            &Pass::Full,
            "",
            &turn(&["a"]),
            false,
            &rows,
            t0,
            took,
        );
        let floor_of = || match floors.plan(&lane(), "", 10, t0) {
            Pass::Floor { floors, .. } => floors[0],
            Pass::Full => panic!("expected a floor pass"),
        };
        // Later claims moved the floor up.
        floors.record(
            &lane(),
            &Pass::Floor {
                tenants: vec![],
                floors: vec![],
                next_cursor: String::new(),
            },
            "",
            &[],
            false,
            &claimed("a", &[40]),
            t0,
            took,
        );
        assert_eq!(floor_of(), 39);
        // An unordered completion frees nothing.
        floors.settled([11], Settled::Completed);
        assert_eq!(floor_of(), 39);
        // A failed (to be retried) delivery comes back below the floor.
        floors.settled([12], Settled::Returned);
        assert_eq!(floor_of(), 11);
        // The next message of an ordering key lies above its completed head.
        floors.settled([10], Settled::Completed);
        assert_eq!(floor_of(), 9);
        // Settled once: a second report is ignored.
        floors.record(
            &lane(),
            &Pass::Floor {
                tenants: vec![],
                floors: vec![],
                next_cursor: String::new(),
            },
            "",
            &[],
            false,
            &claimed("a", &[50]),
            t0,
            took,
        );
        floors.settled([10], Settled::Completed);
        assert_eq!(floor_of(), 49);
    }
}
