//! Values that are not finite, between a worker and the server: two transport messages,
//! not the core's (transport version 7).
//!
//! **From the worker.** A worker's own protocol refuses to send a gradient that holds NaN
//! or ±∞ (or whose norm overflows) or whose loss is NaN or ±∞; the worker then sends
//! `"NFIN"` followed by one little-endian `f32`: 0 for the values, 1 for the loss
//! ([`NotFinite`]). The server counts it as it counts such a contribution refused: values
//! that are not finite end the run as diverged; a loss goes by the rule below. Without it a
//! synchronous round would wait for that worker for ever. A worker of a sharded run sends
//! it to every shard, each of which counts it alike.
//!
//! **From the server.**
//! A contribution whose reported loss is NaN or ±∞ is refused by the protocol (nothing of it
//! is applied). The server then sends the worker `"RFSD"` followed by three little-endian
//! `f32`s: the worker's refusals of this kind so far, how many of them came in a row (no
//! contribution of the worker accepted since the first), and the run's limit: at that many
//! in a row the server ends the run as diverged (a model whose loss a worker cannot compute
//! as a finite number has diverged, as one whose gradient holds NaN has). Both sides log the
//! first refusal, every [`LOG_EVERY`]-th, and every one of a run of two or more, so the log
//! stays bounded however long a run goes on.
//!
//! The message has the layout of every transport message ([`F32Codec`]); `"RF"` is never the
//! start of a core message (`"SY"`). Only a worker gets it (never a group server of remote
//! groups); a worker of an earlier transport version is refused at the handshake.

use super::codec::F32Codec;

/// What a worker's protocol refused to send ([`NOT_FINITE`], `"NFIN"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotFinite {
    /// The gradient holds NaN or ±∞, or its norm overflows.
    Values,
    /// Its loss is NaN or ±∞.
    Loss,
}

/// The worker's message saying what its protocol refused to send.
pub const NOT_FINITE: F32Codec = F32Codec { tag: *b"NFIN", name: "a not-finite message", values: "not-finite codes" };

impl NotFinite {
    /// What a worker's protocol refusing its own gradient for `e` means, if about values
    /// that are not finite.
    pub fn of(e: &syncopate::Reject) -> Option<Self> {
        match e {
            syncopate::Reject::NotFinite | syncopate::Reject::NormTooLarge => Some(Self::Values),
            syncopate::Reject::LossNotFinite => Some(Self::Loss),
            _ => None,
        }
    }

    /// The message.
    pub fn encode(self) -> Vec<u8> {
        NOT_FINITE.encode(&[if self == Self::Values { 0.0 } else { 1.0 }])
    }

    /// What a message says: one code, 0 or 1.
    pub fn decode(payload: &[u8]) -> Result<Self, String> {
        match NOT_FINITE.decode(payload)?.as_slice() {
            [c] if *c == 0.0 => Ok(Self::Values),
            [c] if *c == 1.0 => Ok(Self::Loss),
            other => Err(format!("not-finite codes {other:?} (one of 0 or 1 expected)")),
        }
    }

    /// The core's refusal it stands for.
    pub fn reject(self) -> syncopate::Reject {
        match self {
            Self::Values => syncopate::Reject::NotFinite,
            Self::Loss => syncopate::Reject::LossNotFinite,
        }
    }
}

/// The first four bytes of the server's message.
pub const MAGIC: [u8; 4] = *b"RFSD";

/// The message's codec.
pub const CODEC: F32Codec = F32Codec { tag: MAGIC, name: "a refusal message", values: "refusal counts" };

/// Contributions refused in a row for a loss that is not finite at which the run ends as
/// diverged.
pub const DIVERGED_AFTER: u32 = 3;

/// The log names the first refusal of a worker and then every this many.
pub const LOG_EVERY: u64 = 100;

/// One refusal, as the message says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The worker's refusals of this kind so far (this one included).
    pub total: u64,
    /// How many of them came in a row.
    pub in_a_row: u32,
    /// At this many in a row the run ends as diverged.
    pub limit: u32,
}

impl Refusal {
    /// Whether this refusal is logged: the first, every [`LOG_EVERY`]-th, and each of a
    /// run of two or more (at most the limit, then the run ends).
    pub fn logged(&self) -> bool {
        self.total == 1 || self.total % LOG_EVERY == 0 || self.in_a_row > 1
    }

    /// Whether the run ends at this refusal.
    pub fn ends_the_run(&self) -> bool {
        self.in_a_row >= self.limit
    }

    /// How the counts read in a log line: `(refusal 2 of this worker, 2 in a row; at 3 in
    /// a row the run stops as diverged)`.
    pub fn counts(&self) -> String {
        format!(
            "(refusal {} of this worker, {} in a row; at {} in a row the run stops as diverged)",
            self.total, self.in_a_row, self.limit
        )
    }

    /// The message.
    pub fn encode(&self) -> Vec<u8> {
        // Counts above 2^24 lose their last digits in an f32: the log only reads them.
        CODEC.encode(&[self.total as f32, self.in_a_row as f32, self.limit as f32])
    }

    /// The refusal a message says, checked: three whole, non-negative counts, the limit at
    /// least 1.
    pub fn decode(payload: &[u8]) -> Result<Self, String> {
        let v = CODEC.decode(payload)?;
        let [total, in_a_row, limit] = v.as_slice() else {
            return Err(format!("{} refusal counts (3 expected)", v.len()));
        };
        let whole = |x: f32| x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f32;
        if !(whole(*total) && whole(*in_a_row) && whole(*limit) && *limit >= 1.0) {
            return Err(format!("refusal counts {total}, {in_a_row}, {limit} are not whole counts"));
        }
        Ok(Self { total: *total as u64, in_a_row: *in_a_row as u32, limit: *limit as u32 })
    }
}

/// The worker's log line for a refusal message from the server: `None` when the refusal is
/// not one the log names ([`Refusal::logged`]). A message that does not decode is logged
/// and changes nothing else.
pub(crate) fn worker_line(me: u32, payload: &[u8]) -> Option<String> {
    match Refusal::decode(payload) {
        Ok(r) if r.logged() => {
            Some(format!("worker {me}: the server refused a contribution whose loss is not finite {}", r.counts()))
        }
        Ok(_) => None,
        Err(e) => Some(format!("worker {me}: the server sent a bad refusal message ({e})")),
    }
}

/// Per worker, the refusals for a loss that is not finite: the count in a row, which an
/// accepted contribution ends.
#[derive(Debug)]
pub(crate) struct LossRefusals {
    in_a_row: Vec<u32>,
}

impl LossRefusals {
    /// None yet, for `n` workers.
    pub(crate) fn new(n: usize) -> Self {
        Self { in_a_row: vec![0; n] }
    }

    /// A contribution of `worker` was accepted: its run of refusals ends.
    pub(crate) fn accepted(&mut self, worker: syncopate::WorkerId) {
        if let Some(c) = self.in_a_row.get_mut(worker.index()) {
            *c = 0;
        }
    }

    /// A contribution of `worker` was refused for its loss, its `total`-th such refusal.
    pub(crate) fn refused(&mut self, worker: syncopate::WorkerId, total: u64) -> Refusal {
        let in_a_row = self.in_a_row.get_mut(worker.index()).map_or(1, |c| {
            *c = c.saturating_add(1);
            *c
        });
        Refusal { total, in_a_row, limit: DIVERGED_AFTER }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::WorkerId;

    #[test]
    fn refusals_round_trip_and_bad_counts_are_refused_naming_why() {
        let r = Refusal { total: 7, in_a_row: 2, limit: 3 };
        let bytes = r.encode();
        assert!(CODEC.is(&bytes));
        assert_eq!(Refusal::decode(&bytes), Ok(r));
        assert_eq!(Refusal::decode(&bytes[..12]).unwrap_err(), "2 refusal counts (3 expected)");
        assert_eq!(Refusal::decode(b"SY\x02").unwrap_err(), "not a refusal message");
        for bad in [[1.5f32, 1.0, 3.0], [1.0, -1.0, 3.0], [1.0, 1.0, 0.0], [f32::NAN, 1.0, 3.0]] {
            let e = Refusal::decode(&CODEC.encode(&bad)).unwrap_err();
            assert!(e.ends_with("are not whole counts"), "{bad:?}: {e}");
        }
        assert!(!crate::tcp::step_times::CODEC.is(&bytes) && !crate::tcp::initial::CODEC.is(&bytes));
        for n in [NotFinite::Values, NotFinite::Loss] {
            assert_eq!(NotFinite::decode(&n.encode()), Ok(n));
        }
        assert_eq!(NotFinite::of(&syncopate::Reject::NormTooLarge), Some(NotFinite::Values));
        assert_eq!(NotFinite::of(&syncopate::Reject::Capacity), None);
        let e = NotFinite::decode(&NOT_FINITE.encode(&[2.0])).unwrap_err();
        assert_eq!(e, "not-finite codes [2.0] (one of 0 or 1 expected)");
        assert!(NotFinite::decode(b"NFIN").is_err() && NotFinite::decode(b"SY").is_err());
    }

    #[test]
    fn a_run_of_refusals_ends_at_an_accepted_contribution_and_the_log_is_bounded() {
        let mut l = LossRefusals::new(2);
        let first = l.refused(WorkerId(0), 1);
        assert_eq!(first, Refusal { total: 1, in_a_row: 1, limit: DIVERGED_AFTER });
        assert!(first.logged() && !first.ends_the_run());
        l.accepted(WorkerId(0));
        let alone = l.refused(WorkerId(0), 2);
        assert!(!alone.logged(), "a lone refusal after the first is counted, not logged");
        assert!(l.refused(WorkerId(0), LOG_EVERY).logged(), "every hundredth is logged");
        let third = l.refused(WorkerId(0), LOG_EVERY + 1);
        assert_eq!(third.in_a_row, 3);
        assert!(third.logged() && third.ends_the_run());
        assert_eq!(l.refused(WorkerId(1), 1).in_a_row, 1, "each worker counts its own");
        assert_eq!(l.refused(WorkerId(9), 1).in_a_row, 1, "an id outside the run is one refusal");
        assert_eq!(third.counts(), "(refusal 101 of this worker, 3 in a row; at 3 in a row the run stops as diverged)");
    }
}
