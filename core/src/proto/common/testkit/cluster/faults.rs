//! A [`Cluster`]'s faults and the observations the checks read: joins delivered at once,
//! losses, crashes and restarts, calm, and the log's views (ticks, computations, events,
//! refusals).

use super::*;

impl<S: Server<f64>, W: Worker<f64>> Cluster<S, W> {
    /// Delivers every worker's first pending message (its `Join`) now, in id order.
    pub fn deliver_joins(&mut self) {
        for w in 0..self.nodes.len() {
            let key =
                self.events.iter().find_map(|(k, e)| matches!(e, Ev::Up { from, .. } if *from == w).then_some(*k));
            if let Some(Ev::Up { from, epoch, server_inc, msg }) = key.and_then(|k| self.events.remove(&k)) {
                self.in_flight -= 1;
                self.arrive_up(from, epoch, server_inc, msg);
            }
        }
    }

    /// The transport declares worker `w` lost: it is dead from now on.
    pub fn lose(&mut self, w: usize) {
        if let Some(d) = self.dead.get_mut(w) {
            *d = true;
        }
        let _ = self.server.handle_worker_lost(self.now, WorkerId(w as u32));
        self.log.push(Entry::Lost { worker: w });
        self.drain_server();
    }

    /// The transport loses every worker of `ws` at once: each loss is reported to the
    /// server back to back, with no drain in between (as a driver that found several
    /// connections dead in one pass does), then the server is drained once. Returns what
    /// each report answered.
    pub fn lose_all(&mut self, ws: &[usize]) -> Vec<Result<(), Reject>> {
        let mut answers = Vec::new();
        for &w in ws {
            if let Some(d) = self.dead.get_mut(w) {
                *d = true;
            }
            answers.push(self.server.handle_worker_lost(self.now, WorkerId(w as u32)));
            self.log.push(Entry::Lost { worker: w });
        }
        self.drain_server();
        answers
    }

    /// Crashes worker `w` (its state, messages to it and its jobs are gone; the server is
    /// told), restarting it after `restart_after` when given.
    pub fn crash(&mut self, w: usize, restart_after: Option<Duration>) {
        let Some(node) = self.nodes.get_mut(w) else { return };
        if node.worker.is_none() {
            return;
        }
        node.worker = None;
        node.inc += 1;
        self.counts.crashes += 1;
        let _ = self.server.handle_worker_lost(self.now, WorkerId(w as u32));
        self.log.push(Entry::Lost { worker: w });
        self.drain_server();
        if let Some(after) = restart_after {
            self.schedule(self.now + after, Ev::Restart { w });
        }
    }

    /// Starts worker `w` afresh with the next epoch, built by the factory (nothing happens
    /// without one).
    pub fn restart_worker(&mut self, w: usize) {
        let Some(factory) = self.factory.as_mut() else { return };
        let Some(node) = self.nodes.get_mut(w) else { return };
        node.inc += 1;
        node.epoch += 1;
        node.timer = None;
        node.worker = Some(factory(w as u32, node.epoch));
        self.drain_worker(w);
    }

    /// Replaces the server (a restart from a checkpoint): messages on their way to the old
    /// one are lost, and every worker restarts with a new epoch (through the factory).
    pub fn restart_server(&mut self, server: S) {
        self.server = server;
        self.server_inc += 1;
        self.server_timer = None;
        self.counts.server_restarts += 1;
        self.log.push(Entry::ServerRestarted);
        self.last_tick = (self.probe)(&self.server);
        for w in 0..self.nodes.len() {
            self.restart_worker(w);
        }
        self.drain_server();
    }

    /// Whether the server-restart fault fired since the last call (the caller builds the new
    /// server and calls [`Self::restart_server`]).
    pub fn take_restart_request(&mut self) -> bool {
        core::mem::take(&mut self.restart_requested)
    }

    /// Switches the faults off, heals partitions and restarts crashed workers.
    pub fn calm(&mut self) {
        self.faults = Faults::default();
        for node in &mut self.nodes {
            node.cut_up_until = Instant::ZERO;
            node.cut_down_until = Instant::ZERO;
        }
        for w in 0..self.nodes.len() {
            if self.nodes[w].worker.is_none() {
                self.restart_worker(w);
            }
        }
    }

    pub(super) fn inject(&mut self) {
        let f = self.faults;
        let n = self.nodes.len() as u64;
        if self.chance(f.crash) {
            let w = self.rng.below(n) as usize;
            let after = self.draw(self.config.restart_after);
            self.crash(w, Some(after));
        }
        if self.chance(f.partition) {
            let w = self.rng.below(n) as usize;
            let until = self.now + self.draw(self.config.partition_for);
            let up = self.chance(0.5);
            if let Some(node) = self.nodes.get_mut(w) {
                if up {
                    node.cut_up_until = until;
                } else {
                    node.cut_down_until = until;
                }
            }
            self.counts.partitions += 1;
        }
        if self.chance(f.server_restart) {
            self.restart_requested = true;
        }
    }

    /// The `(tick, params as bits)` sequence.
    pub fn ticks(&self) -> Vec<(u64, Vec<u64>)> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Entry::Tick { tick, params } => Some((*tick, params.iter().map(|p| p.to_bits()).collect())),
                _ => None,
            })
            .collect()
    }

    /// Per worker, the parameters of every computation, in order, as bits.
    pub fn computes(&self) -> Vec<Vec<Vec<u64>>> {
        let mut out = vec![Vec::new(); self.nodes.len()];
        for e in &self.log {
            if let Entry::Compute { worker, params, .. } = e {
                if let Some(o) = out.get_mut(*worker) {
                    o.push(params.iter().map(|p| p.to_bits()).collect());
                }
            }
        }
        out
    }

    /// The server's events, in order.
    pub fn events(&self) -> impl Iterator<Item = &ServerEvent> {
        self.log.iter().filter_map(|e| match e {
            Entry::Event(ev) => Some(ev),
            _ => None,
        })
    }

    /// Messages the workers refused, with the worker.
    pub fn refused(&self) -> Vec<(usize, ToWorkerOwned)> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Entry::WorkerRefused { worker, msg, .. } => Some((*worker, msg.clone())),
                _ => None,
            })
            .collect()
    }
}
