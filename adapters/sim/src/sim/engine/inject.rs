//! The simulator's fault injection: message loss, delay, duplication and one-way partitions
//! (scripted and random) on each worker's links, worker crashes and restarts (scripted and
//! random), and server crashes with a restart from the last checkpoint, drawn from the
//! injector's state (`faults`); in the quiet phase nothing more is injected.

use super::faults::{Fate, exp_mean, exp_secs};
use super::{Core, Engine, Event, new_worker};
use crate::sim::config::Direction;
use crate::sim::report::closing::add_stats;
use crate::sim::report::{Fault, Node, Observation};
use core::fmt::Write as _;
use syncopate::{AnyServer, Duration, Instant, Server, WorkerId};

impl Core<'_, '_> {
    /// What the network does with a message handed to worker `worker`'s link in direction
    /// `dir` now, which would arrive at `arrival` (draws nothing without message faults, or
    /// in the quiet phase).
    pub(super) fn fate(&mut self, worker: u32, dir: Direction, arrival: Instant) -> Fate {
        let mut fate = Fate { first: Some(arrival), replay: None, faults: [None, None] };
        let now = self.now;
        if !self.faults.messages || self.faults.quiet.is_some_and(|q| now >= q) {
            return fate;
        }
        let f = &self.config.faults;
        let since = now - Instant::ZERO;
        let scripted =
            f.cuts.iter().any(|c| c.worker == worker && c.direction == dir && c.from <= since && since < c.until);
        let link = 2 * worker as usize + usize::from(dir == Direction::Down);
        let random = self.faults.cuts.get_mut(link).is_some_and(|p| p.cut_at(now, f.cut_rate, f.cut_mean));
        let rng = &mut self.faults.rng;
        if scripted || random {
            fate.first = None;
            fate.faults[0] = Some(Fault::Partitioned);
            return fate;
        }
        if f.loss > 0.0 && rng.next_f64() < f.loss {
            fate.first = None;
            fate.faults[0] = Some(Fault::Dropped);
            return fate;
        }
        if f.delay > 0.0 && rng.next_f64() < f.delay {
            let extra = exp_mean(rng, f.delay_mean);
            fate.first = Some(arrival + extra);
            fate.faults[0] = Some(Fault::Delayed(extra));
        }
        if f.duplicate > 0.0 && rng.next_f64() < f.duplicate {
            let later = exp_mean(rng, f.replay_delay);
            fate.replay = fate.first.map(|t| t + later);
            fate.faults[1] = Some(Fault::Duplicated(later));
        }
        fate
    }

    /// Schedules the deliveries of `fate` for the message in `slot` (one buffer reference
    /// each; the sender releases its own).
    pub(super) fn schedule_fate(&mut self, fate: &Fate, slot: usize, event: Event) {
        for at in [fate.first, fate.replay].into_iter().flatten() {
            self.pool.share(slot, 1);
            self.schedule(at, event);
        }
    }

    pub(super) fn record_faults(&mut self, from: Node, to: Node, kind: &'static str, fate: &Fate) {
        for fault in fate.faults.into_iter().flatten() {
            self.fault(from, to, kind, fault);
        }
    }

    pub(super) fn fault(&mut self, from: Node, to: Node, kind: &'static str, fault: Fault) {
        self.faults.stats.count(fault, kind);
        self.tag(10, from);
        self.hash.node(to);
        self.hash.bytes(kind.as_bytes());
        let _ = write!(self.hash, "{fault:?}");
        let at = self.now;
        self.observe(&Observation::Fault { at, from, to, kind, fault });
    }
}

impl Engine<'_, '_> {
    /// Worker `worker` crashes (if it is up).
    pub(super) fn crash(&mut self, worker: u32, restart_after: Option<Duration>, notify_server: bool) -> bool {
        let now = self.core.now;
        let Some(host) = self.hosts.get_mut(worker as usize) else { return false };
        if host.worker.is_none() {
            return false;
        }
        host.worker = None;
        host.incarnation += 1;
        host.timer = None;
        if let Some(job) = host.job.take() {
            host.busy = host.busy + (now - job.start);
            host.report.jobs_abandoned += 1;
        }
        host.uplink.reset(now);
        host.downlink.reset(now);
        host.report.crashes += 1;
        self.core.tag(7, Node::Worker(worker));
        self.core.observe(&Observation::Crashed { at: now, worker: WorkerId(worker) });
        if notify_server {
            match self.core.group_of.get(worker as usize).copied() {
                Some(g) => {
                    if let Some(node) = self.groups.get_mut(g as usize) {
                        let result = node.server.handle_worker_lost(now, WorkerId(worker));
                        let _ = write!(self.core.hash, "{result:?}");
                        self.drain_group(g as usize, now);
                    }
                }
                None if !self.server_down => {
                    let result = self.server.handle_worker_lost(now, WorkerId(worker));
                    let _ = write!(self.core.hash, "{result:?}");
                    self.drain_server(now);
                }
                None => {}
            }
        }
        if let Some(after) = restart_after {
            self.core.schedule(now + after, Event::Restart(worker));
        }
        true
    }

    /// Schedules worker `worker`'s next random crash, if before the quiet phase.
    pub(super) fn schedule_random_crash(&mut self, worker: u32) {
        let rate = self.core.config.faults.crash_rate;
        let Some(rng) = self.core.faults.crash_rngs.get_mut(worker as usize) else { return };
        let at = self.core.now + exp_secs(rng, rate);
        if self.core.faults.quiet.is_none_or(|q| at < q) {
            self.core.schedule(at, Event::RandomCrash(worker));
        }
    }

    pub(super) fn random_crash(&mut self, worker: u32) {
        let f = &self.core.config.faults;
        let (mean, notify) = (f.restart_mean, f.crash_notify_server);
        let Some(rng) = self.core.faults.crash_rngs.get_mut(worker as usize) else { return };
        let restart = exp_mean(rng, mean);
        if self.crash(worker, Some(restart), notify) {
            self.core.faults.stats.random_crashes += 1;
        }
        self.schedule_random_crash(worker);
    }

    pub(super) fn restart(&mut self, worker: u32) {
        let now = self.core.now;
        let dim = self.core.workload.model.dim();
        let Some(host) = self.hosts.get_mut(worker as usize) else { return };
        if host.worker.is_some() {
            return;
        }
        let epoch = host.epoch + 1;
        // The configuration was valid for epoch 0, so it is for this one.
        let Ok(w) = new_worker(self.core.config, dim, worker, epoch) else { return };
        host.epoch = epoch;
        host.worker = Some(w);
        self.core.tag(8, Node::Worker(worker));
        self.core.observe(&Observation::Restarted { at: now, worker: WorkerId(worker), epoch });
        self.drain_worker(worker as usize, now);
    }

    /// The server crashes: everything but the checkpoint (model and version as of the last
    /// update; the model only changes with the version) is lost.
    pub(super) fn server_crash(&mut self, i: usize) {
        let now = self.core.now;
        let Some(c) = self.core.config.faults.server_crashes.get(i).copied() else { return };
        if self.server_down || !self.groups.is_empty() {
            return;
        }
        let version = self.server.version();
        self.checkpoint = Some((self.server.params().to_vec(), version));
        add_stats(&mut self.dead_stats, self.server.stats());
        self.server_down = true;
        self.core.server_timer = None;
        self.core.faults.stats.server_crashes += 1;
        self.core.tag(11, Node::Server);
        self.core.hash.u64(version.0);
        self.core.observe(&Observation::ServerCrashed { at: now, version });
        self.core.schedule(now + c.down_for, Event::ServerRestart);
    }

    /// A new server resumes from the checkpoint.
    pub(super) fn server_restart(&mut self) {
        let now = self.core.now;
        let Some((params, version)) = self.checkpoint.take() else { return };
        let protocol = &self.core.config.protocol;
        let scratch = vec![0.0; protocol.server_scratch_len(params.len())];
        // The configuration was valid at the start, so it is for the resumed server.
        let spare = vec![0.0; protocol.spare_accumulator_len(params.len())];
        let (beta, dim) = (self.core.config.momentum, params.len());
        let server = AnyServer::resume(protocol, params, scratch, version)
            .and_then(|s| s.with_spare_accumulator(spare))
            .and_then(|s| super::momentum(s, beta, dim));
        let Ok(server) = server else { return };
        *self.server = server;
        self.server_down = false;
        self.core.faults.stats.server_restarts += 1;
        self.core.tag(13, Node::Server);
        self.core.hash.u64(version.0);
        self.core.observe(&Observation::ServerRestarted { at: now });
        self.drain_server(now);
    }
}
