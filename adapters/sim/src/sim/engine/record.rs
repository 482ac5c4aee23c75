//! The engine's bookkeeping verbs: scheduling, observations, the trace hash, message and
//! event counters, timers, and evaluations.

use super::*;

impl Core<'_, '_> {
    pub(super) fn schedule(&mut self, at: Instant, event: Event) {
        if !matches!(event, Event::Eval) {
            self.pending_work += 1;
        }
        self.queue.push(Scheduled { at, seq: self.seq, event });
        self.seq += 1;
    }

    pub(super) fn observe(&mut self, o: &Observation<'_>) {
        (self.observer)(o);
    }

    pub(super) fn tag(&mut self, tag: u64, node: Node) {
        self.hash.u64(tag);
        self.hash.u64(self.now.as_nanos());
        self.hash.node(node);
    }

    pub(super) fn server_event(&mut self, node: Node, event: ServerEvent) {
        self.tag(1, node);
        self.fast_debug.server_event(&mut self.hash, &event);
        match event {
            ServerEvent::Applied { staleness, .. } => self.staleness.record(staleness),
            ServerEvent::Stalled { .. } => self.stalls += 1,
            _ => {}
        }
        let at = self.now;
        self.observe(&Observation::Server { at, event });
    }

    /// An event of the central node of a two-level run (its "workers" are the groups: not
    /// recorded as worker staleness).
    pub(super) fn central_event(&mut self, event: ServerEvent) {
        self.tag(12, Node::Server);
        self.fast_debug.server_event(&mut self.hash, &event);
        let at = self.now;
        self.observe(&Observation::Central { at, event });
    }

    pub(super) fn worker_event(&mut self, worker: u32, event: WorkerEvent) {
        self.tag(2, Node::Worker(worker));
        let _ = write!(self.hash, "{event:?}");
        let at = self.now;
        self.observe(&Observation::Worker { at, worker: WorkerId(worker), event });
    }

    pub(super) fn sent(&mut self, from: Node, to: Node, kind: &'static str, bytes: usize) {
        self.tag(3, from);
        self.hash.node(to);
        self.hash.bytes(kind.as_bytes());
        self.hash.u64(bytes as u64);
        self.bytes += bytes as u64;
        let at = self.now;
        self.observe(&Observation::Sent { at, from, to, kind, bytes });
    }

    pub(super) fn delivered(
        &mut self,
        from: Node,
        to: Node,
        kind: &'static str,
        bytes: usize,
        result: Result<(), Reject>,
    ) {
        self.tag(4, to);
        self.hash.node(from);
        self.hash.result(&result);
        self.delivered += 1;
        if matches!(result, Err(Reject::NotFinite | Reject::NormTooLarge)) {
            self.not_finite += 1;
            self.diverged = true;
        }
        if result.is_err() && matches!(to, Node::Worker(_)) {
            self.worker_rejects += 1;
        }
        let at = self.now;
        self.observe(&Observation::Delivered { at, from, to, kind, bytes, result });
    }

    /// A server with no link above it sent a message upstream: a bug in the engine's
    /// deployment (only the sub-server nodes of a two-level run have an upstream, and each
    /// has its link), counted with the codec errors (a bug; always 0), never dropped silently.
    pub(super) fn no_uplink(&mut self, from: Node, msg: &ToServer<'_, f32>) {
        self.codec_error(&format_args!("{from} sent {} upstream but has no uplink", msg.kind_name()));
    }

    pub(super) fn codec_error(&mut self, what: &dyn core::fmt::Debug) {
        self.codec_errors += 1;
        debug_assert!(false, "simulator codec error (a bug in the wire codec or the simulator): {what:?}");
    }

    /// Arms a node's timer for `deadline` (not before `floor`) unless an earlier one is armed.
    pub(super) fn rearm(
        &mut self,
        armed: Option<Instant>,
        deadline: Option<Instant>,
        floor: Instant,
        event: Event,
    ) -> Option<Instant> {
        let Some(t) = deadline else { return armed };
        let t = t.max(floor);
        if armed.is_none_or(|a| t < a) {
            self.schedule(t, event);
            Some(t)
        } else {
            armed
        }
    }

    pub(super) fn evaluate(&mut self, server: &AnyServer<f32, Vec<f32>, Heap>) {
        let e = self.workload.model.evaluate_with(server.params(), &self.workload.test, &mut self.eval_scratch);
        let point = CurvePoint {
            time_s: self.now.as_secs_f64(),
            version: server.version().0,
            accuracy: e.accuracy,
            loss: e.loss,
        };
        self.tag(6, Node::Server);
        self.hash.u64(point.version);
        self.hash.u64(point.accuracy.to_bits());
        self.hash.u64(point.loss.to_bits());
        if self.time_to_target.is_none() && point.accuracy >= self.config.target_accuracy {
            // The crossing happened at the earliest kept model that reaches the target (at
            // the latest, this one).
            let first =
                self.crossing.first_reaching(self.workload, self.config.target_accuracy, &mut self.eval_scratch);
            self.time_to_target = Some(first.unwrap_or((point.time_s, point.version)));
            self.target_reached = true;
            self.crossing.clear();
        }
        if !point.loss.is_finite() {
            self.diverged = true;
        }
        if self.config.stop.stop_at_loss.is_some_and(|x| point.loss <= x) {
            self.loss_reached = true;
        }
        self.curve.push(point);
        self.observe(&Observation::Evaluated { point });
    }
}
