//! The workers' reported minibatch losses on their way into the model updates.
//!
//! A contribution (`Grad`, `Delta`, `Clock`) may carry its worker's minibatch loss. The
//! engine refuses a non-finite one before the protocol sees the message
//! ([`Reject::LossNotFinite`](crate::Reject::LossNotFinite)), then leaves the finite loss in
//! [`LossTally::incoming`] while the protocol handles the message; a protocol that takes the
//! contribution into its pending update counts it (`LossTally::count`) and, when it
//! applies the update, reports the mean of the losses counted since the previous update in
//! [`ServerEvent::ModelUpdated`](crate::proto::ServerEvent::ModelUpdated)
//! (`LossTally::take_mean`). A dropped contribution's loss is never counted.

/// The reported losses of the contributions in the pending update, and the loss of the
/// message being handled.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossTally {
    /// The loss of the message being handled, if it reported one (finite).
    pub(crate) incoming: Option<f32>,
    sum: f64,
    count: u32,
}

impl LossTally {
    /// No losses.
    pub const fn new() -> Self {
        Self { incoming: None, sum: 0.0, count: 0 }
    }

    /// The loss of the message being handled, if it reported one (finite).
    pub fn incoming(&self) -> Option<f32> {
        self.incoming
    }

    /// Counts the loss of the message being handled into the pending update (a protocol
    /// calls it once per contribution it takes).
    pub(crate) fn count(&mut self) {
        self.add(self.incoming);
    }

    /// Counts `loss`, if any, into the pending update.
    pub(crate) fn add(&mut self, loss: Option<f32>) {
        if let Some(loss) = loss {
            self.sum += f64::from(loss);
            self.count = self.count.saturating_add(1);
        }
    }

    /// How many losses the pending update has counted.
    pub fn counted(&self) -> u32 {
        self.count
    }

    /// The mean of the losses counted so far (`None` if none was), without taking them.
    pub(crate) fn mean(&self) -> Option<f32> {
        (self.count > 0).then(|| (self.sum / f64::from(self.count)) as f32)
    }

    /// Refuses a reported loss that is NaN or ±∞.
    pub(crate) fn check(loss: Option<f32>) -> Result<(), crate::Reject> {
        match loss {
            Some(l) if !l.is_finite() => Err(crate::Reject::LossNotFinite),
            _ => Ok(()),
        }
    }

    /// The mean of the losses counted since the last call (`None` if none was), and a
    /// fresh pending update.
    pub(crate) fn take_mean(&mut self) -> Option<f32> {
        let mean = self.mean();
        self.sum = 0.0;
        self.count = 0;
        mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_covers_the_counted_losses_once() {
        let mut t = LossTally::new();
        assert_eq!(t.take_mean(), None);
        t.incoming = Some(1.0);
        t.count();
        t.incoming = None;
        t.count();
        t.incoming = Some(4.0);
        t.count();
        assert_eq!(t.counted(), 2);
        assert_eq!(t.take_mean(), Some(2.5));
        assert_eq!(t.take_mean(), None);
        t.incoming = Some(f32::MAX);
        t.count();
        t.incoming = Some(f32::MAX);
        t.count();
        assert_eq!(t.take_mean(), Some(f32::MAX));
    }
}

#[cfg(test)]
mod server_tests {
    use crate::Reject;
    use crate::id::{ComputeId, Version, WorkerId};
    use crate::msg::{ToServer, ToWorker, Values};
    use crate::proto::asp::{AspConfig, AspServer};
    use crate::proto::bsp::{BspConfig, BspServer};
    use crate::proto::common::testkit::drain_server as drain;
    use crate::proto::{GradientWorker, GradientWorkerConfig, Server, ServerEvent, Worker, WorkerOutput};
    use crate::time::Instant;
    use std::vec;
    use std::vec::Vec;

    fn grad(base: u64, seq: u64, values: &[f64], loss: Option<f32>) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: base, seq, values: Values::Slice(values), loss }
    }

    fn updates(events: &[ServerEvent]) -> Vec<Option<f32>> {
        events
            .iter()
            .filter_map(|e| match e {
                ServerEvent::ModelUpdated { mean_loss, .. } => Some(*mean_loss),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_bsp_update_reports_the_mean_of_its_gradients_losses() {
        let mut s: BspServer<f64, Vec<f64>> =
            BspServer::new(BspConfig::new(3, 0.5), vec![1.0f64; 2], vec![0.0; 2]).unwrap();
        let now = Instant::ZERO;
        s.handle(now, WorkerId(0), grad(0, 0, &[1.0, 1.0], Some(1.0))).unwrap();
        // A non-finite loss is refused like a non-finite gradient, counted, and changes
        // nothing: the same sequence number is accepted afterwards.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0, 1.0], Some(bad))), Err(Reject::LossNotFinite));
        }
        assert_eq!(s.stats().rejected, 3);
        s.handle(now, WorkerId(1), grad(0, 0, &[1.0, 1.0], None)).unwrap();
        s.handle(now, WorkerId(2), grad(0, 0, &[1.0, 1.0], Some(4.0))).unwrap();
        let (events, _) = drain(&mut s);
        assert_eq!(updates(&events), [Some(2.5)]);
        // A stale gradient's loss is not part of the next update.
        s.handle(now, WorkerId(0), grad(0, 1, &[1.0, 1.0], Some(100.0))).unwrap();
        for w in 0..3 {
            s.handle(now, WorkerId(w), grad(1, 2, &[1.0, 1.0], None)).unwrap();
        }
        let (events, _) = drain(&mut s);
        assert_eq!(updates(&events), [None]);
    }

    #[test]
    fn an_asp_update_reports_its_gradients_loss() {
        let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(2, 0.5), vec![1.0f64; 2]).unwrap();
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0, 1.0], Some(0.75))).unwrap();
        s.handle(Instant::ZERO, WorkerId(1), grad(1, 0, &[1.0, 1.0], None)).unwrap();
        let (events, _) = drain(&mut s);
        assert_eq!(updates(&events), [Some(0.75), None]);
    }

    #[test]
    fn a_worker_sends_the_loss_with_its_gradient_and_refuses_a_non_finite_one() {
        let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(0)), vec![0.0f32; 2]).unwrap();
        while w.poll_output().is_some() {}
        let model = [1.0f32, 2.0];
        w.handle(Instant::ZERO, ToWorker::Model { version: Version(0), clock: 0, values: Values::Slice(&model) })
            .unwrap();
        while w.poll_output().is_some() {}
        let id = ComputeId(0);
        assert_eq!(
            w.handle_gradient_with_loss(Instant::ZERO, id, &[1.0, 1.0], Some(f32::NAN)),
            Err(Reject::LossNotFinite)
        );
        w.handle_gradient_with_loss(Instant::ZERO, id, &[1.0, 1.0], Some(0.5)).unwrap();
        match w.poll_output() {
            Some(WorkerOutput::Send(msg @ ToServer::Grad { .. })) => assert_eq!(msg.loss(), Some(0.5)),
            other => panic!("expected the gradient, got {other:?}"),
        }
    }
}
