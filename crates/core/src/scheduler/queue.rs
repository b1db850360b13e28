//! The scheduler's queue: calls waiting for a slot, in a **lane** per party (an agent, or an
//! operator's own calls in a namespace) per pool, served in turns.
//!
//! Within a lane, calls keep their order (a call taken back from a worker goes to the front
//! of its lane). Between lanes of a pool, the lane that goes next is the one that waited
//! longest since its last call went to a worker ([`Queue::served`] sends a lane to the back
//! of its pool's turns): one agent's flood of calls cannot starve another agent's single
//! call. A lane holds at most the scheduler's `max_per_agent` calls that admission put
//! there ([`QueueFull`]); calls coming back (failover, a retry's backoff, an approval,
//! a restart) are never refused.

use super::Call;
use crate::call::CallRecord;
use crate::error::{ApiError, ErrorKind};
use crate::ids::{CallId, ObjectKey};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

/// The default cap of an agent's calls waiting in one pool.
pub const DEFAULT_MAX_PER_AGENT: u32 = 1000;

/// Whose calls share a lane.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    /// An agent's calls (namespace/name).
    Agent(ObjectKey),
    /// The calls operators made as themselves in a namespace.
    Operators { namespace: String },
}

impl Party {
    /// The party a call acts for.
    pub fn of(namespace: &str, agent: Option<&str>) -> Self {
        match agent {
            Some(name) => Party::Agent(ObjectKey::new(namespace, name)),
            None => Party::Operators {
                namespace: namespace.to_string(),
            },
        }
    }

    fn of_record(record: &CallRecord) -> Self {
        Party::of(&record.namespace, record.spec.access.agent.as_deref())
    }
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Party::Agent(key) => write!(f, "agent {key}"),
            Party::Operators { namespace } => write!(f, "operators of namespace {namespace}"),
        }
    }
}

/// A lane: a party's calls waiting in one pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane {
    pub pool: String,
    pub party: Party,
}

impl Lane {
    pub fn of(record: &CallRecord) -> Self {
        Lane {
            pool: record.spec.pool.clone(),
            party: Party::of_record(record),
        }
    }
}

/// A new call refused because its lane holds `max` calls already.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} has {queued} calls waiting for a worker of pool {} (at most {max}); try again when some have started",
    .lane.party, .lane.pool
)]
pub struct QueueFull {
    pub lane: Lane,
    pub queued: usize,
    pub max: u32,
}

/// How long a caller refused [`QueueFull`] is told to wait before trying again.
pub const QUEUE_FULL_RETRY_AFTER_MS: u64 = 1000;

impl From<QueueFull> for ApiError {
    fn from(full: QueueFull) -> Self {
        ApiError::new(ErrorKind::QueueFull, full.to_string())
            .with_retry_after(QUEUE_FULL_RETRY_AFTER_MS)
    }
}

pub(super) struct Queued {
    pub call: Call,
    /// Not before this (a store write for it failed, or a retry's backoff).
    pub not_before: Option<Instant>,
}

/// The waiting calls of one pool.
#[derive(Default)]
struct Pool {
    /// Parties with waiting calls; the front goes next.
    turns: VecDeque<Party>,
    lanes: HashMap<Party, VecDeque<Queued>>,
}

impl Pool {
    fn lane_mut(&mut self, party: Party) -> &mut VecDeque<Queued> {
        if !self.lanes.contains_key(&party) {
            self.turns.push_back(party.clone());
        }
        self.lanes.entry(party).or_default()
    }

    fn forget_empty(&mut self) {
        self.lanes.retain(|_, lane| !lane.is_empty());
        let lanes = &self.lanes;
        self.turns.retain(|party| lanes.contains_key(party));
    }
}

/// The calls waiting for a slot (see the module's documentation).
#[derive(Default)]
pub(super) struct Queue {
    pools: BTreeMap<String, Pool>,
    /// The waiting calls' deadlines (Unix ms; calls without one are not here), earliest
    /// first: the timer asks for the earliest on every wake, with thousands waiting.
    deadlines: BTreeSet<(i64, CallId)>,
    /// The waiting calls that may not be offered before a time, earliest first.
    not_before: BTreeSet<(Instant, CallId)>,
}

impl Queue {
    fn index(&mut self, queued: &Queued) {
        let id = queued.call.id();
        if queued.call.deadline_ms > 0 {
            self.deadlines.insert((queued.call.deadline_ms, id.clone()));
        }
        if let Some(at) = queued.not_before {
            self.not_before.insert((at, id.clone()));
        }
    }

    fn unindex(
        deadlines: &mut BTreeSet<(i64, CallId)>,
        not_before: &mut BTreeSet<(Instant, CallId)>,
        queued: &Queued,
    ) {
        let id = queued.call.id();
        deadlines.remove(&(queued.call.deadline_ms, id.clone()));
        if let Some(at) = queued.not_before {
            not_before.remove(&(at, id.clone()));
        }
    }

    /// The earliest deadline (Unix ms) of a waiting call.
    pub fn earliest_deadline_ms(&self) -> Option<i64> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// The earliest time a waiting call may be offered again after a backoff.
    pub fn earliest_not_before(&self) -> Option<Instant> {
        self.not_before.first().map(|(at, _)| *at)
    }

    fn pool_mut(&mut self, pool: &str) -> &mut Pool {
        self.pools.entry(pool.to_string()).or_default()
    }

    /// Queues a call at the back of its lane.
    pub fn push_back(&mut self, queued: Queued) {
        self.index(&queued);
        let lane = Lane::of(&queued.call.record);
        self.pool_mut(&lane.pool)
            .lane_mut(lane.party)
            .push_back(queued);
    }

    /// Queues a call at the front of its lane (a call taken back keeps its place).
    pub fn push_front(&mut self, queued: Queued) {
        self.index(&queued);
        let lane = Lane::of(&queued.call.record);
        self.pool_mut(&lane.pool)
            .lane_mut(lane.party)
            .push_front(queued);
    }

    /// Whether calls of `pool` are waiting.
    pub fn has_waiting(&self, pool: &str) -> bool {
        self.pools.get(pool).is_some_and(|p| !p.lanes.is_empty())
    }

    /// Calls waiting in `lane`.
    pub fn len_of(&self, lane: &Lane) -> usize {
        self.pools
            .get(&lane.pool)
            .and_then(|p| p.lanes.get(&lane.party))
            .map_or(0, VecDeque::len)
    }

    /// Every waiting call, pool by pool, each pool's lanes in turn order.
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.pools.values().flat_map(|pool| {
            pool.turns
                .iter()
                .filter_map(|party| pool.lanes.get(party))
                .flatten()
        })
    }

    /// Changes waiting call `id` in place (tests: a deadline moved into the past).
    #[cfg(test)]
    pub fn update(&mut self, id: &CallId, change: impl FnOnce(&mut Queued)) {
        let Queue {
            pools,
            deadlines,
            not_before,
        } = self;
        for lane in pools.values_mut().flat_map(|pool| pool.lanes.values_mut()) {
            if let Some(queued) = lane.iter_mut().find(|q| q.call.id() == id) {
                Self::unindex(deadlines, not_before, queued);
                change(queued);
                if queued.call.deadline_ms > 0 {
                    deadlines.insert((queued.call.deadline_ms, id.clone()));
                }
                if let Some(at) = queued.not_before {
                    not_before.insert((at, id.clone()));
                }
                return;
            }
        }
    }

    /// The pools with waiting calls.
    pub fn pools(&self) -> Vec<String> {
        self.pools
            .iter()
            .filter(|(_, p)| !p.lanes.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The waiting calls of `pool` in the order they are offered a slot: lane by lane in
    /// turn order, each lane front to back. Each with its lane's party and its place in it.
    pub fn offers<'a>(
        &'a self,
        pool: &str,
    ) -> impl Iterator<Item = (&'a Party, usize, &'a Queued)> {
        self.pools.get(pool).into_iter().flat_map(|pool| {
            pool.turns.iter().flat_map(move |party| {
                pool.lanes
                    .get(party)
                    .into_iter()
                    .flat_map(move |lane| lane.iter().enumerate().map(move |(i, q)| (party, i, q)))
            })
        })
    }

    /// Takes call `index` of `party`'s lane in `pool` for a slot: the lane's turn is over,
    /// it goes to the back of the pool's turns.
    pub fn served(&mut self, pool: &str, party: &Party, index: usize) -> Option<Queued> {
        let waiting = self.pools.get_mut(pool)?;
        let lane = waiting.lanes.get_mut(party)?;
        let queued = lane.remove(index)?;
        Self::unindex(&mut self.deadlines, &mut self.not_before, &queued);
        let empty = lane.is_empty();
        waiting.turns.retain(|p| p != party);
        if empty {
            waiting.lanes.remove(party);
        } else {
            waiting.turns.push_back(party.clone());
        }
        if waiting.lanes.is_empty() {
            self.pools.remove(pool);
        }
        Some(queued)
    }

    /// Keeps only the calls for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&Queued) -> bool) {
        let Queue {
            pools,
            deadlines,
            not_before,
        } = self;
        for pool in pools.values_mut() {
            for lane in pool.lanes.values_mut() {
                lane.retain(|queued| {
                    let kept = keep(queued);
                    if !kept {
                        Self::unindex(deadlines, not_before, queued);
                    }
                    kept
                });
            }
            pool.forget_empty();
        }
        pools.retain(|_, p| !p.lanes.is_empty());
    }

    /// The waiting call `id`.
    pub fn find(&self, id: &CallId) -> Option<&Queued> {
        self.iter().find(|q| q.call.id() == id)
    }
}
