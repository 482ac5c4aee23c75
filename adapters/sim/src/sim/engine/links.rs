//! Messages between the nodes: each is encoded into a pooled buffer with the core's wire
//! codec, crosses its link (transfer time, then the fault injector's fate) and is decoded
//! and handed to the receiving node, whose outputs are then drained.

use super::*;

impl Core<'_, '_> {
    /// Encodes a worker's message into a pool buffer; `None` on a codec error.
    pub(super) fn encode_to_server(&mut self, msg: &ToServer<'_, f32>) -> Option<(usize, usize)> {
        self.encode(wire::encoded_len_to_server(msg), |out| wire::encode_to_server(msg, out))
    }

    /// Encodes the server's message into a pool buffer; `None` on a codec error.
    pub(super) fn encode_to_worker(&mut self, msg: &ToWorker<'_, f32>) -> Option<(usize, usize)> {
        self.encode(wire::encoded_len_to_worker(msg), |out| wire::encode_to_worker(msg, out))
    }

    /// Writes `len` bytes with `encode` into a pool buffer: its slot and the length written,
    /// or `None` (the buffer back in the pool, the codec error counted).
    fn encode(
        &mut self,
        len: usize,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::EncodeError>,
    ) -> Option<(usize, usize)> {
        let slot = self.pool.take(len);
        match encode(self.pool.bytes_mut(slot)) {
            Ok(n) => {
                self.pool.set_len(slot, n);
                Some((slot, n))
            }
            Err(e) => {
                self.pool.release(slot);
                self.codec_error(&e);
                None
            }
        }
    }

    /// Puts a server's (or a group node's) message on the downlinks of its recipients (every
    /// live worker, or every live member of the sending group, for a broadcast; one encoding
    /// shared by all copies).
    pub(super) fn send_to_workers(&mut self, hosts: &mut [Host], from: Node, to: Recipient, msg: &ToWorker<'_, f32>) {
        let kind = msg.kind_name();
        let Some((slot, len)) = self.encode_to_worker(msg) else { return };
        let send = |core: &mut Self, i: usize, host: &mut Host| {
            if host.worker.is_none() {
                core.lost += 1;
                return;
            }
            let worker = i as u32;
            let arrival = host.downlink.send(core.now, len);
            let fate = core.fate(worker, Direction::Down, arrival);
            let event = Event::Deliver { slot, worker, to_server: false, incarnation: host.incarnation };
            core.schedule_fate(&fate, slot, event);
            core.sent(from, Node::Worker(worker), kind, len);
            core.record_faults(from, Node::Worker(worker), kind, &fate);
        };
        match to {
            Recipient::Worker(w) => match hosts.get_mut(w.index()) {
                Some(host) if self.reaches(from, w.0) => send(self, w.index(), host),
                _ => self.lost += 1,
            },
            Recipient::AllWorkers => {
                for (i, host) in hosts.iter_mut().enumerate() {
                    if self.reaches(from, i as u32) {
                        send(self, i, host);
                    }
                }
            }
        }
        self.pool.release(slot);
    }

    /// Whether `from` talks to `worker` directly (a group node only to its members).
    pub(super) fn reaches(&self, from: Node, worker: u32) -> bool {
        match from {
            Node::Group(g) => self.group_of.get(worker as usize) == Some(&g),
            _ => true,
        }
    }

    /// The node worker `worker` sends to.
    pub(super) fn server_node(&self, worker: u32) -> Node {
        self.group_of.get(worker as usize).map_or(Node::Server, |&g| Node::Group(g))
    }
}

impl Engine<'_, '_> {
    /// A message on worker `worker`'s link arrives (at the server node if `to_server`).
    pub(super) fn deliver(&mut self, slot: usize, worker: u32, to_server: bool, incarnation: u32) {
        let now = self.core.now;
        let Some(host) = self.hosts.get_mut(worker as usize) else {
            self.core.pool.release(slot);
            return;
        };
        if host.incarnation != incarnation || host.worker.is_none() {
            // The worker crashed while the message was in flight.
            self.core.pool.release(slot);
            self.core.lost += 1;
            return;
        }
        let group = self.core.group_of.get(worker as usize).copied();
        let bytes = self.core.pool.bytes(slot);
        let len = bytes.len();
        let id = WorkerId(worker);
        if to_server && group.is_none() && self.server_down {
            let kind = wire::decode_to_server::<f32>(bytes, &self.core.limits).map_or("", |m| m.kind_name());
            self.core.pool.release(slot);
            self.core.fault(Node::Worker(worker), Node::Server, kind, Fault::ServerDown);
            return;
        }
        let outcome = if to_server {
            match wire::decode_to_server::<f32>(bytes, &self.core.limits) {
                Ok(msg) => {
                    let kind = msg.kind_name();
                    let result = match group.and_then(|g| self.groups.get_mut(g as usize)) {
                        Some(node) => node.server.handle(now, id, msg),
                        None => self.server.handle(now, id, msg),
                    };
                    Ok((kind, result))
                }
                Err(e) => Err(e),
            }
        } else {
            match (wire::decode_to_worker::<f32>(bytes, &self.core.limits), host.worker.as_mut()) {
                (Ok(msg), Some(w)) => Ok((msg.kind_name(), w.handle(now, msg))),
                (Ok(_), None) => Ok(("", Err(Reject::Stopped))),
                (Err(e), _) => Err(e),
            }
        };
        self.core.pool.release(slot);
        let (kind, result) = match outcome {
            Ok(x) => x,
            Err(e) => {
                self.core.codec_error(&e);
                return;
            }
        };
        let server_node = self.core.server_node(worker);
        let (from, to) =
            if to_server { (Node::Worker(worker), server_node) } else { (server_node, Node::Worker(worker)) };
        self.core.delivered(from, to, kind, len, result);
        match (to_server, group) {
            (true, Some(g)) => self.drain_group(g as usize, now),
            (true, None) => self.drain_server(now),
            (false, _) => self.drain_worker(worker as usize, now),
        }
    }

    /// A message between group `group` and the central node arrives.
    pub(super) fn group_deliver(&mut self, slot: usize, group: u32, to_central: bool) {
        let now = self.core.now;
        let Some(node) = self.groups.get_mut(group as usize) else {
            self.core.pool.release(slot);
            return;
        };
        let bytes = self.core.pool.bytes(slot);
        let len = bytes.len();
        let outcome = if to_central {
            wire::decode_to_server::<f32>(bytes, &self.core.limits)
                .map(|msg| (msg.kind_name(), self.server.handle(now, WorkerId(group), msg)))
        } else {
            wire::decode_to_worker::<f32>(bytes, &self.core.limits)
                .map(|msg| (msg.kind_name(), node.server.handle_upstream(now, msg)))
        };
        self.core.pool.release(slot);
        let (kind, result) = match outcome {
            Ok(x) => x,
            Err(e) => {
                self.core.codec_error(&e);
                return;
            }
        };
        let (from, to) =
            if to_central { (Node::Group(group), Node::Server) } else { (Node::Server, Node::Group(group)) };
        self.core.delivered(from, to, kind, len, result);
        if to_central {
            self.drain_server(now);
        } else {
            self.drain_group(group as usize, now);
        }
    }
}
