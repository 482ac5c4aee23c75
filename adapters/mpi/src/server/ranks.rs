//! What a server rank knows about the other ranks: the worker ranks (liveness, epochs,
//! losses) and, with shards, the other shard ranks it watches.

use mpi::topology::Rank;
use std::time::{Duration, Instant};
use syncopate::{Recipient, WorkerId};

/// What the loop knows about the worker ranks.
pub(super) struct Ranks {
    /// The first worker rank (the number of shards).
    pub(super) first: Rank,
    pub(super) last_heard: Vec<Instant>,
    pub(super) lost: Vec<bool>,
    pub(super) live: Vec<Rank>,
    /// The epoch of each worker's last accepted `Join`.
    pub(super) epoch: Vec<u32>,
    /// Whether a lost rank was told to rejoin.
    pub(super) told: Vec<bool>,
}

impl Ranks {
    pub(super) fn new(n: u32, first: Rank) -> Self {
        let now = Instant::now();
        let count = n as usize;
        Self {
            first,
            last_heard: vec![now; count],
            lost: vec![false; count],
            live: (first..first + n as Rank).collect(),
            epoch: vec![0; count],
            told: vec![false; count],
        }
    }

    /// The worker of `rank`, if it is a worker rank.
    pub(super) fn worker(&self, rank: Rank) -> Option<WorkerId> {
        let w = u32::try_from(rank.checked_sub(self.first)?).ok()?;
        ((w as usize) < self.lost.len()).then_some(WorkerId(w))
    }

    pub(super) fn rank(&self, w: WorkerId) -> Rank {
        self.first + w.index() as Rank
    }

    pub(super) fn is_lost(&self, w: WorkerId) -> bool {
        self.lost.get(w.index()).copied().unwrap_or(true)
    }

    pub(super) fn epoch(&self, w: WorkerId) -> u32 {
        self.epoch.get(w.index()).copied().unwrap_or(0)
    }

    pub(super) fn mark_lost(&mut self, w: WorkerId) {
        if let Some(l) = self.lost.get_mut(w.index()) {
            *l = true;
        }
        if let Some(t) = self.told.get_mut(w.index()) {
            *t = false;
        }
        let rank = self.rank(w);
        self.live.retain(|r| *r != rank);
    }

    pub(super) fn revive(&mut self, w: WorkerId) {
        if let Some(l) = self.lost.get_mut(w.index()) {
            *l = false;
        }
        let rank = self.rank(w);
        if let Err(at) = self.live.binary_search(&rank) {
            self.live.insert(at, rank);
        }
    }

    /// The live ranks a message to `to` goes to.
    pub(super) fn recipients(&self, to: Recipient) -> &[Rank] {
        match to {
            Recipient::AllWorkers => &self.live,
            Recipient::Worker(w) => {
                let rank = self.rank(w);
                self.live.binary_search(&rank).map_or(&[], |i| &self.live[i..=i])
            }
        }
    }
}

/// The other shards this shard watches: rank 0 watches every other shard, the others
/// watch rank 0.
pub(super) struct Peers {
    pub(super) ranks: Vec<Rank>,
    pub(super) last_heard: Vec<Instant>,
    pub(super) next_heartbeat: Instant,
    pub(super) interval: Duration,
}

impl Peers {
    pub(super) fn new(shard: u32, shards: u32, lost_after: Duration) -> Self {
        let ranks: Vec<Rank> = match shard {
            _ if shards <= 1 => Vec::new(),
            0 => (1..shards as Rank).collect(),
            _ => vec![0],
        };
        let now = Instant::now();
        let interval = crate::heartbeat_interval(lost_after);
        Self { last_heard: vec![now; ranks.len()], ranks, next_heartbeat: now + interval, interval }
    }

    pub(super) fn heard(&mut self, rank: Rank) {
        if let Some(i) = self.ranks.iter().position(|r| *r == rank) {
            if let Some(t) = self.last_heard.get_mut(i) {
                *t = Instant::now();
            }
        }
    }
}
