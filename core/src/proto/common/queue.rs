//! Fixed-capacity output queues. Items are small descriptors; payloads are borrowed from the
//! state machine's buffers only when an item is polled, so queuing a model broadcast costs
//! no copy. A server's per-worker outputs of one step (a round's `Applied` events, a model
//! to each contributor, an abort to each straggler) are one [`Batch`] item, expanded one
//! output at a time when polled, so the queue's depth does not depend on `n`.

use crate::error::Reject;
use crate::id::{ComputeId, Version, WorkerId};
use crate::msg::{ToServer, Values};
use crate::proto::{Recipient, ServerEvent, WorkerEvent, WorkerOutput};
use heapless::Deque;

/// Capacity of a server's output queue, whatever `n`: every protocol's burst is a constant
/// (per-worker outputs are batched), proven by the capacity tests.
pub(crate) const SERVER_QUEUE: usize = 80;
/// Capacity of a worker's output queue.
pub(crate) const WORKER_QUEUE: usize = 16;

/// A server output before its payload is attached (what a protocol's
/// [`Rules::expand`](crate::proto::Rules::expand) returns for one worker of a batch).
///
/// The tag is a word of its own (`repr(u64)`, 8 bytes more per item) rather than a byte
/// inside the event ([`Reject`]'s, through the niche): an event is then copied out whole,
/// not field by field in byte-sized pieces, and telling items apart is one compare.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum ServerItem {
    /// The current model (version, clock and params read at poll time).
    Model {
        /// The recipient.
        to: Recipient,
    },
    /// [`ToWorker::NotNewer`](crate::ToWorker::NotNewer).
    NotNewer {
        /// The recipient.
        to: WorkerId,
        /// The version it has, still current.
        version: Version,
    },
    /// [`ToWorker::PushAck`](crate::ToWorker::PushAck).
    PushAck {
        /// The recipient.
        to: WorkerId,
        /// The round the server is in.
        round: Version,
        /// Whether the worker should pull the model now.
        pull_now: bool,
    },
    /// [`ToWorker::Abort`](crate::ToWorker::Abort).
    Abort {
        /// The recipient.
        to: WorkerId,
        /// The iteration to abandon.
        iteration: u64,
    },
    /// [`ToWorker::Stop`](crate::ToWorker::Stop) to every worker.
    Stop,
    /// An event.
    Event(ServerEvent),
    /// One output per matching worker, expanded at poll time.
    Batch(Batch),
}

/// Per-worker outputs queued as one item: when polled, the server walks its worker records
/// from `next` and emits one output for each record the kind selects (the protocol's
/// [`Rules::expand`](crate::proto::Rules::expand)), in id order. While a batch is queued the
/// server takes no input (it is refused with [`Reject::Capacity`], which a caller that
/// drains after every input never sees), so the records it reads cannot change under it.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// What to emit, and for whom.
    pub(crate) kind: BatchKind,
    /// The next worker index to look at.
    pub(crate) next: u32,
}

/// What a [`Batch`] emits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BatchKind {
    /// [`ServerEvent::Applied`] for every worker whose record's mark is `version` (its
    /// gradient went into the round that made `version`), with weight `factor / k`.
    Applied {
        /// The version the round's gradients were computed on.
        base: Version,
        /// The version the round made.
        version: Version,
        /// The round's contributions.
        k: u32,
    },
    /// The current model to every worker whose record's mark is `mark`.
    Models {
        /// The mark.
        mark: u64,
    },
    /// Protocol-defined: expanded by the protocol alone, with `tag`, `a` and `b` its own.
    Protocol {
        /// Which of the protocol's batches.
        tag: u8,
        /// Its first argument.
        a: u64,
        /// Its second argument.
        b: u64,
    },
}

impl Batch {
    /// A batch of `kind` starting at worker 0.
    pub(crate) const fn new(kind: BatchKind) -> Self {
        Self { kind, next: 0 }
    }
}

/// The slot of an item [`FrontQueue::take_front`] took out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken(usize);

/// A fixed-capacity first-in first-out queue of small `Copy` items, used front to back:
/// outputs are drained after every input, so the queue is usually empty when an input
/// arrives, and when the last item is taken both ends go back to the array's start; pushing
/// and taking then touch no wrap-around arithmetic. A queue that is not drained still holds
/// `N` items: a push that meets the array's end first moves the pending items to its start.
#[derive(Debug)]
pub(crate) struct FrontQueue<I, const N: usize> {
    items: [I; N],
    /// The front item's index (`head <= tail <= N`).
    head: usize,
    /// One past the back item's index.
    tail: usize,
}

impl<I: Copy, const N: usize> FrontQueue<I, N> {
    /// An empty queue (`fill` only initialises the unused slots).
    pub(crate) const fn new(fill: I) -> Self {
        Self { items: [fill; N], head: 0, tail: 0 }
    }

    /// Items pending.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.tail - self.head
    }

    /// Queues `item`; `false` (and the item is not queued) if `N` items are pending.
    #[inline]
    #[must_use]
    pub(crate) fn push(&mut self, item: I) -> bool {
        self.push_with(|| item)
    }

    /// [`Self::push`] of the item `make` builds, built straight into its slot, never built on
    /// the stack and copied in.
    #[inline(always)]
    #[must_use]
    pub(crate) fn push_with(&mut self, make: impl FnOnce() -> I) -> bool {
        match self.items.get_mut(self.tail) {
            Some(slot) => {
                *slot = make();
                self.tail += 1;
                true
            }
            None => self.push_at_end(make()),
        }
    }

    /// [`Self::push`] when the back is at the array's end.
    #[cold]
    fn push_at_end(&mut self, item: I) -> bool {
        if self.head == 0 {
            return false;
        }
        self.items.copy_within(self.head..self.tail, 0);
        self.tail -= self.head;
        self.head = 0;
        self.push(item)
    }

    /// The front item (to copy out, then [`Self::advance`], or to change in place).
    #[inline]
    pub(crate) fn front_mut(&mut self) -> Option<&mut I> {
        if self.head < self.tail { self.items.get_mut(self.head) } else { None }
    }

    /// Removes the front item (nothing if the queue is empty).
    #[inline]
    pub(crate) fn advance(&mut self) {
        self.head += 1;
        if self.head >= self.tail {
            (self.head, self.tail) = (0, 0);
        }
    }

    /// Removes the front item, leaving it in its slot (until the next push), and returns
    /// the slot.
    #[inline]
    pub(crate) fn take_front(&mut self) -> Option<Taken> {
        let slot = self.head;
        if slot >= self.tail {
            return None;
        }
        self.advance();
        Some(Taken(slot))
    }

    /// The item [`Self::take_front`] took out of `taken`'s slot.
    #[inline]
    pub(crate) fn taken(&self, taken: Taken) -> Option<&I> {
        self.items.get(taken.0)
    }

    /// Removes and returns the front item.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<I> {
        let item = *self.front_mut()?;
        self.advance();
        Some(item)
    }
}

/// A server's pending outputs.
#[derive(Debug)]
pub(crate) struct ServerQueue {
    items: FrontQueue<ServerItem, SERVER_QUEUE>,
    /// Batches among the pending items.
    batches: u32,
    /// Pushes that found the queue full (never expected: see [`Self::push`]).
    lost: u64,
}

impl ServerQueue {
    pub(crate) const fn new() -> Self {
        Self { items: FrontQueue::new(ServerItem::Stop), batches: 0, lost: 0 }
    }

    /// Items pending.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Queues `item`. Every input is screened first with [`Self::ensure_room`] for the most
    /// outputs it can produce (each protocol's `burst`, a constant proven by the capacity
    /// tests at the largest `n`), and refused with [`Reject::Capacity`] before any state
    /// changes when there is not room; so a push cannot find the queue full. Should it
    /// ever, the output is counted in
    /// [`ServerStats::outputs_lost`](crate::proto::ServerStats) rather than dropped
    /// silently, and the tests fail on any count but zero.
    #[inline(always)]
    pub(crate) fn push(&mut self, item: ServerItem) {
        if !self.items.push_with(|| item) {
            self.lost += 1;
        }
    }

    /// Queues a batch of `kind` (counted among the batches if it is queued, among the lost
    /// outputs if not). Inlined, with one test of the push's result (not a comparison of the
    /// lost count before and after a [`Self::push`]): every round close runs it.
    #[inline]
    pub(crate) fn push_batch(&mut self, kind: BatchKind) {
        if self.items.push_with(|| ServerItem::Batch(Batch::new(kind))) {
            self.batches += 1;
        } else {
            self.lost += 1;
        }
    }

    /// Outputs that found the queue full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    /// Refuses new input while there is not room for a full burst, or a batch is still
    /// being expanded (its records must not change before it is drained).
    #[inline]
    pub(crate) fn ensure_room(&self, burst: usize) -> Result<(), Reject> {
        if self.batches == 0 && SERVER_QUEUE - self.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    /// The front item, to copy out (then [`Self::advance`]) or, if it is a batch, to expand
    /// in place.
    #[inline]
    pub(crate) fn front_mut(&mut self) -> Option<&mut ServerItem> {
        self.items.front_mut()
    }

    /// Removes the front item (which is not a batch: see [`Self::finish_batch`]).
    #[inline]
    pub(crate) fn advance(&mut self) {
        self.items.advance();
    }

    /// Removes the front item (which is not a batch), leaving it in its slot: returns the
    /// slot, for [`Self::taken`] to read it where it lies.
    #[inline]
    pub(crate) fn take_front(&mut self) -> Option<Taken> {
        self.items.take_front()
    }

    /// The item [`Self::take_front`] took out (unchanged until the next push).
    #[inline]
    pub(crate) fn taken(&self, taken: Taken) -> Option<&ServerItem> {
        self.items.taken(taken)
    }

    /// Removes the front item, a batch fully expanded.
    #[inline]
    pub(crate) fn finish_batch(&mut self) {
        self.batches = self.batches.saturating_sub(1);
        self.items.advance();
    }

    /// Removes and returns the front item.
    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<ServerItem> {
        let item = *self.front_mut()?;
        if matches!(item, ServerItem::Batch(_)) {
            self.finish_batch();
        } else {
            self.advance();
        }
        Some(item)
    }
}

/// A worker output before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WorkerItem {
    Join {
        epoch: u32,
    },
    /// Payload: the worker's outgoing buffer.
    Grad {
        base: Version,
        iteration: u64,
        seq: u64,
        loss: Option<f32>,
    },
    /// Payload: the worker's outgoing buffer.
    Delta {
        round: Version,
        local_steps: u32,
        seq: u64,
        loss: Option<f32>,
    },
    Pull {
        have: Version,
        min_clock: u64,
    },
    /// Payload: the worker's outgoing buffer.
    Clock {
        clock: u64,
        seq: u64,
        loss: Option<f32>,
    },
    /// Params: the worker's model buffer.
    Compute {
        id: ComputeId,
        version: Version,
    },
    Event(WorkerEvent),
}

/// A worker's pending outputs.
#[derive(Debug)]
pub(crate) struct WorkerQueue {
    items: Deque<WorkerItem, WORKER_QUEUE>,
    /// Pushes that found the queue full (never expected: see [`Self::push`]).
    lost: u64,
}

impl WorkerQueue {
    pub(crate) const fn new() -> Self {
        Self { items: Deque::new(), lost: 0 }
    }

    /// Queues `item`. A worker checks [`Self::ensure_room`] for the few outputs an input can
    /// produce before it changes any state, so a push cannot find the queue full; should it
    /// ever, the output is counted ([`Worker::outputs_lost`](crate::proto::Worker)), never
    /// dropped silently.
    #[inline]
    pub(crate) fn push(&mut self, item: WorkerItem) {
        if self.items.push_back(item).is_err() {
            self.lost += 1;
        }
    }

    /// Outputs that found the queue full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    pub(crate) fn ensure_room(&self, burst: usize) -> Result<(), Reject> {
        if WORKER_QUEUE - self.items.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    /// Whether the next output is a message to the server (`None`: no output pending).
    pub(crate) fn next_is_send(&self) -> Option<bool> {
        self.items.front().map(|item| !matches!(item, WorkerItem::Compute { .. } | WorkerItem::Event(_)))
    }

    /// Attaches payloads: `params` for `Compute`, `outgoing` for tensors sent to the server.
    pub(crate) fn poll<'a, T>(&mut self, params: &'a [T], outgoing: &'a [T]) -> Option<WorkerOutput<'a, T>> {
        let item = self.items.pop_front()?;
        Some(match item {
            WorkerItem::Join { epoch } => WorkerOutput::Send(ToServer::Join { epoch }),
            WorkerItem::Grad { base, iteration, seq, loss } => {
                WorkerOutput::Send(ToServer::Grad { base, iteration, seq, values: Values::Slice(outgoing), loss })
            }
            WorkerItem::Delta { round, local_steps, seq, loss } => {
                WorkerOutput::Send(ToServer::Delta { round, local_steps, seq, values: Values::Slice(outgoing), loss })
            }
            WorkerItem::Pull { have, min_clock } => WorkerOutput::Send(ToServer::Pull { have, min_clock }),
            WorkerItem::Clock { clock, seq, loss } => {
                WorkerOutput::Send(ToServer::Clock { clock, seq, values: Values::Slice(outgoing), loss })
            }
            WorkerItem::Compute { id, version } => WorkerOutput::Compute { id, version, params },
            WorkerItem::Event(e) => WorkerOutput::Event(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u32) -> ServerItem {
        ServerItem::Event(ServerEvent::ModelUpdated {
            version: Version(u64::from(i)),
            contributions: i,
            mean_loss: None,
        })
    }

    fn popped(q: &mut ServerQueue) -> Option<u32> {
        match q.pop()? {
            ServerItem::Event(ServerEvent::ModelUpdated { contributions, .. }) => Some(contributions),
            _ => None,
        }
    }

    /// Items leave in the order they came, across the move to the array's start that a push
    /// at its end makes, and a push into a queue that is really full is counted lost.
    #[test]
    fn fifo_across_the_array_end_and_full_pushes_counted() {
        let mut q = ServerQueue::new();
        let (mut pushed, mut next) = (0u32, 0u32);
        // Never fully drained: the back reaches the array's end many times over.
        for round in 0..100 {
            let burst = if round == 0 { 10 } else { 3 + round % 5 };
            for _ in 0..burst {
                assert!(q.ensure_room(1).is_ok());
                q.push(event(pushed));
                pushed += 1;
            }
            for _ in 0..(3 + round % 5) {
                assert_eq!(popped(&mut q), Some(next));
                next += 1;
            }
            assert_eq!(q.len() as u32, pushed - next);
        }
        assert!(pushed > 2 * SERVER_QUEUE as u32);
        while let Some(v) = popped(&mut q) {
            assert_eq!(v, next);
            next += 1;
        }
        assert_eq!((next, q.len(), q.lost()), (pushed, 0, 0));
        for i in 0..SERVER_QUEUE as u32 {
            q.push(event(i));
        }
        assert_eq!(q.ensure_room(1), Err(Reject::Capacity));
        q.push(event(0));
        assert_eq!((q.len(), q.lost()), (SERVER_QUEUE, 1));
        assert_eq!(popped(&mut q), Some(0));
        q.push(event(SERVER_QUEUE as u32));
        assert_eq!((q.len(), q.lost()), (SERVER_QUEUE, 1));
        for i in 1..=SERVER_QUEUE as u32 {
            assert_eq!(popped(&mut q), Some(i));
        }
        assert_eq!(q.pop().map(|_| ()), None);
    }

    /// `take_front` takes items out in the order they came, each still readable in its slot
    /// (what `poll_output` reads), across the return of both ends to the array's start.
    #[test]
    fn taken_items_are_read_in_order_where_they_lie() {
        let mut q = ServerQueue::new();
        for round in 0..3u32 {
            for i in 0..=round {
                q.push(event(10 * round + i));
            }
            for i in 0..=round {
                let taken = q.take_front().expect("an item");
                let item = q.taken(taken).copied();
                assert!(
                    matches!(item, Some(ServerItem::Event(ServerEvent::ModelUpdated { contributions, .. })) if contributions == 10 * round + i)
                );
            }
            assert_eq!(q.len(), 0);
            assert!(q.take_front().is_none());
        }
    }

    /// A queued batch refuses input until it is taken out.
    #[test]
    fn a_batch_blocks_input_until_finished() {
        let mut q = ServerQueue::new();
        q.push(event(1));
        q.push_batch(BatchKind::Models { mark: 3 });
        assert_eq!(q.ensure_room(1), Err(Reject::Capacity));
        assert_eq!(popped(&mut q), Some(1));
        assert_eq!(q.ensure_room(1), Err(Reject::Capacity));
        assert!(matches!(q.pop(), Some(ServerItem::Batch(_))));
        assert_eq!(q.ensure_room(1), Ok(()));
    }
}
