//! Draining a node after an input: the server's (or a group node's) outputs sent to their
//! recipients, a worker's messages sent and its computations started, then the node's timer
//! re-armed.

use super::*;

impl Engine<'_, '_> {
    /// Drains the server's outputs, then re-arms its timer (not before `floor`).
    pub(super) fn drain_server(&mut self, floor: Instant) {
        let Self { core, server, hosts, groups, .. } = self;
        if groups.is_empty() {
            while let Some(out) = server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => core.send_to_workers(hosts, Node::Server, to, &msg),
                    ServerOutput::Event(e) => core.server_event(Node::Server, e),
                    ServerOutput::Upstream(msg) => core.no_uplink(Node::Server, &msg),
                }
            }
        } else {
            // The central node of a two-level run: its "workers" are the group nodes.
            while let Some(out) = server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        let kind = msg.kind_name();
                        let Some((slot, len)) = core.encode_to_worker(&msg) else { continue };
                        for (g, node) in groups.iter_mut().enumerate() {
                            if matches!(to, Recipient::Worker(w) if w.index() != g) {
                                continue;
                            }
                            let at = node.downlink.send(core.now, len);
                            core.pool.share(slot, 1);
                            core.schedule(at, Event::GroupDeliver { slot, group: g as u32, to_central: false });
                            core.sent(Node::Server, Node::Group(g as u32), kind, len);
                        }
                        core.pool.release(slot);
                    }
                    ServerOutput::Event(e) => core.central_event(e),
                    ServerOutput::Upstream(msg) => core.no_uplink(Node::Server, &msg),
                }
            }
        }
        let floor = floor.max(core.now);
        core.server_timer = core.rearm(core.server_timer, server.poll_timeout(), floor, Event::ServerTimer);
    }

    /// Drains sub-server node `g`'s outputs toward its members and, up its link, toward the
    /// central node, then re-arms its timer.
    pub(super) fn drain_group(&mut self, g: usize, floor: Instant) {
        let Self { core, hosts, groups, .. } = self;
        let Some(node) = groups.get_mut(g) else { return };
        let from = Node::Group(g as u32);
        while let Some(out) = node.server.poll_output() {
            match out {
                ServerOutput::Send { to, msg } => core.send_to_workers(hosts, from, to, &msg),
                ServerOutput::Event(e) => core.server_event(from, e),
                ServerOutput::Upstream(msg) => {
                    let kind = msg.kind_name();
                    let Some((slot, len)) = core.encode_to_server(&msg) else { continue };
                    let at = node.uplink.send(core.now, len);
                    core.schedule(at, Event::GroupDeliver { slot, group: g as u32, to_central: true });
                    core.sent(from, Node::Server, kind, len);
                }
            }
        }
        let floor = floor.max(core.now);
        node.timer = core.rearm(node.timer, node.server.poll_timeout(), floor, Event::GroupTimer(g as u32));
    }

    /// Drains worker `i`'s outputs: sends its messages, starts its computations; then re-arms
    /// its timer.
    pub(super) fn drain_worker(&mut self, i: usize, floor: Instant) {
        let Self { core, hosts, .. } = self;
        let Some(host) = hosts.get_mut(i) else { return };
        let Host {
            worker, incarnation, uplink, sampler, batches, batch, grad, scratch, job, busy, report, timer, ..
        } = host;
        let Some(w) = worker.as_mut() else { return };
        let now = core.now;
        let worker_index = i as u32;
        let node = Node::Worker(worker_index);
        let to = core.server_node(worker_index);
        while let Some(out) = w.poll_output() {
            match out {
                WorkerOutput::Send(msg) => {
                    let kind = msg.kind_name();
                    if matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. }) {
                        report.gradients_sent += 1;
                    }
                    let Some((slot, len)) = core.encode_to_server(&msg) else { continue };
                    let arrival = uplink.send(now, len);
                    let fate = core.fate(worker_index, Direction::Up, arrival);
                    let event =
                        Event::Deliver { slot, worker: worker_index, to_server: true, incarnation: *incarnation };
                    core.schedule_fate(&fate, slot, event);
                    core.pool.release(slot);
                    core.sent(node, to, kind, len);
                    core.record_faults(node, to, kind, &fate);
                }
                WorkerOutput::Compute { id, params, .. } => {
                    if let Some(old) = job.take() {
                        // One job at a time: the new one replaces it.
                        *busy = *busy + (now - old.start);
                        report.jobs_abandoned += 1;
                    }
                    let (mut loss, mut computed) = (None, false);
                    if core.config.gradient == GradientSource::Workload {
                        batches.next_batch(core.config.batch_size, batch);
                        let model = &core.workload.model;
                        // A loss that overflowed is not reported (the core would refuse the
                        // gradient for it); a diverging gradient is caught as before.
                        loss = Some(model.gradient(params, &core.workload.train, batch, grad, scratch))
                            .filter(|l| l.is_finite());
                        computed = true;
                    }
                    let step = sampler.steps();
                    let dt = sampler.next_step();
                    if core.config.record_trace {
                        let gradient = computed.then(|| (params, &grad[..], loss.map_or(f64::NAN, f64::from)));
                        core.trace.record(worker_index, step, dt.as_secs_f64(), gradient);
                    }
                    *job = Some(Job { id, start: now, loss });
                    core.schedule(now + dt, Event::ComputeDone { worker: worker_index, incarnation: *incarnation, id });
                    core.tag(9, node);
                    core.hash.u64(id.0);
                    core.hash.u64(dt.as_nanos());
                }
                WorkerOutput::Event(e) => {
                    if let WorkerEvent::Abandoned { id } = e {
                        if let Some(j) = job.take_if(|j| j.id == id) {
                            *busy = *busy + (now - j.start);
                            report.jobs_abandoned += 1;
                        }
                    }
                    core.worker_event(worker_index, e);
                }
            }
        }
        let floor = floor.max(now);
        let event = Event::WorkerTimer { worker: worker_index, incarnation: *incarnation };
        *timer = core.rearm(*timer, w.poll_timeout(), floor, event);
    }
}
