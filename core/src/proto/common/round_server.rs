//! The verbs every round-based server answers (BSP, static backup workers, DBW): who
//! contributed to the open round.

use super::round::Round;
use super::table::Storage;
use crate::id::WorkerId;
use crate::math::Scalar;

/// Rules that aggregate in a round: their servers answer who contributed to the open round.
pub trait HasRound {
    /// Contributions to the open round.
    fn round_len(&self) -> usize;
}

impl<T, S, R, M> crate::proto::ProtocolServer<T, S, R, M>
where
    T: Scalar,
    S: crate::proto::Buffer<T>,
    M: Storage,
    R: crate::proto::Rules<T, S, M> + HasRound,
{
    /// How many workers' gradients for the current version are in.
    pub fn received(&self) -> usize {
        self.rules.round_len()
    }

    /// Whether `worker`'s gradient for the current version is in.
    pub fn has_received(&self, worker: WorkerId) -> bool {
        Round::contains(&self.core.roster, worker, self.core.version)
    }

    /// The workers whose gradient for the current version is in, in id order (a pass over
    /// the table).
    pub fn contributors(&self) -> impl Iterator<Item = WorkerId> + '_ {
        Round::members(&self.core.roster, self.core.version)
    }
}
