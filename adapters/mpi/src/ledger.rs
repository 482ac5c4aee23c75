//! The conservation ledger of one server rank (a shard, or the one server), and the report
//! a shard sends rank 0 at the end of a sharded run (MPI-free, so it is tested anywhere).

use syncopate::ServerStats;

/// What became of the contributions (gradients, deltas, clock updates) sent to one server
/// rank: every one the workers sent was delivered or arrived after the rank stopped; every
/// delivered one was accepted or refused; every accepted one applied, dropped or held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardLedger {
    /// The shard (0 with one server).
    pub shard: u32,
    /// Parameters it holds.
    pub elements: u64,
    /// Workers live when it stopped: the tallies due.
    pub live: u32,
    /// Workers whose final tally arrived (a lost rank's may not).
    pub tallies: u32,
    /// Contributions the workers say they sent it (the tallies that arrived).
    pub sent: u64,
    /// Contributions it received while running and fed to the protocol (or refused
    /// undecoded, or from a rank it had declared lost).
    pub delivered: u64,
    /// Of those, refused.
    pub refused: u64,
    /// Contributions that arrived after it stopped (not fed).
    pub late: u64,
    /// The protocol's counters: accepted, applied, dropped (every reason).
    pub accepted: u64,
    /// Applied to the model.
    pub applied: u64,
    /// Dropped, every reason.
    pub dropped: u64,
    /// Model updates.
    pub updates: u64,
}

impl ShardLedger {
    /// Whether the ledger balances: every live worker's tally arrived (and a worker's
    /// contributions to this rank arrive before its tally: MPI keeps one sender's messages
    /// in order), and every contribution is accounted for.
    pub fn balanced(&self) -> bool {
        self.tallies >= self.live
            && self.sent == self.delivered + self.late
            && self.delivered == self.accepted + self.refused
            && self.applied + self.dropped <= self.accepted
    }

    /// Contributions accepted and neither applied nor dropped when the rank stopped.
    pub fn held(&self) -> u64 {
        self.accepted.saturating_sub(self.applied + self.dropped)
    }
}

/// What a shard rank reports to rank 0 at the end of a sharded run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardSummary {
    /// Its ledger.
    pub ledger: ShardLedger,
    /// Its protocol counters.
    pub stats: ServerStats,
    /// Its final model version.
    pub version: u64,
    /// Staleness of its applied contributions: sum, count and maximum.
    pub staleness: (u64, u64, u64),
    /// Stall reports it made.
    pub stalls: u64,
    /// Inputs it refused.
    pub refused: u64,
    /// Its final slice of the model.
    pub params: Vec<f32>,
}

/// The `u64` words before the slice.
const WORDS: usize = 23;

impl ShardSummary {
    /// Little-endian encoding: the counters, then the slice.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (l, s) = (&self.ledger, &self.stats);
        let words: [u64; WORDS] = [
            u64::from(l.shard),
            l.elements,
            u64::from(l.tallies),
            u64::from(l.live),
            l.sent,
            l.delivered,
            l.refused,
            l.late,
            s.accepted,
            s.applied,
            s.dropped[0],
            s.dropped[1],
            s.dropped[2],
            s.dropped[3],
            s.dropped[4],
            s.rejected,
            s.updates,
            s.outputs_lost,
            self.version,
            self.staleness.0,
            self.staleness.1,
            self.staleness.2,
            self.stalls,
        ];
        let mut out = Vec::with_capacity(8 * (WORDS + 1) + 4 * self.params.len());
        out.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        out.extend(self.refused.to_le_bytes());
        out.extend(self.params.iter().flat_map(|x| x.to_le_bytes()));
        out
    }

    /// Decodes [`ShardSummary::to_bytes`] of a slice of `elements` parameters; `None` for any
    /// other length.
    pub fn from_bytes(bytes: &[u8], elements: usize) -> Option<Self> {
        let head = 8 * (WORDS + 1);
        if bytes.len() != head.checked_add(elements.checked_mul(4)?)? {
            return None;
        }
        let word =
            |i: usize| -> Option<u64> { Some(u64::from_le_bytes(bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?)) };
        let w: Vec<u64> = (0..=WORDS).map(word).collect::<Option<_>>()?;
        let params = bytes
            .get(head..)?
            .chunks_exact(4)
            .map(|c| <[u8; 4]>::try_from(c).ok().map(f32::from_le_bytes))
            .collect::<Option<_>>()?;
        let ledger = ShardLedger {
            shard: u32::try_from(w[0]).ok()?,
            elements: w[1],
            tallies: u32::try_from(w[2]).ok()?,
            live: u32::try_from(w[3]).ok()?,
            sent: w[4],
            delivered: w[5],
            refused: w[6],
            late: w[7],
            accepted: w[8],
            applied: w[9],
            dropped: w[10..15].iter().sum(),
            updates: w[16],
        };
        let stats = ServerStats {
            accepted: w[8],
            applied: w[9],
            dropped: [w[10], w[11], w[12], w[13], w[14]],
            rejected: w[15],
            updates: w[16],
            outputs_lost: w[17],
        };
        Some(Self {
            ledger,
            stats,
            version: w[18],
            staleness: (w[19], w[20], w[21]),
            stalls: w[22],
            refused: w[23],
            params,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_summary_round_trips_and_refuses_other_lengths() {
        let stats =
            ServerStats { accepted: 9, applied: 7, dropped: [1, 0, 0, 1, 0], rejected: 2, updates: 3, outputs_lost: 0 };
        let ledger = ShardLedger {
            shard: 2,
            elements: 3,
            live: 4,
            tallies: 4,
            sent: 12,
            delivered: 11,
            refused: 2,
            late: 1,
            accepted: 9,
            applied: 7,
            dropped: 2,
            updates: 3,
        };
        let s = ShardSummary {
            ledger,
            stats,
            version: 3,
            staleness: (4, 7, 1),
            stalls: 1,
            refused: 2,
            params: vec![0.5, -1.0, 2.25],
        };
        let bytes = s.to_bytes();
        assert_eq!(ShardSummary::from_bytes(&bytes, 3), Some(s));
        assert_eq!(ShardSummary::from_bytes(&bytes, 2), None);
        assert_eq!(ShardSummary::from_bytes(&bytes[1..], 3), None);
        assert!(ledger.balanced());
        assert!(!ShardLedger { live: 5, ..ledger }.balanced(), "a missing tally leaves the ledger open");
        assert!(!ShardLedger { late: 0, ..ledger }.balanced());
        assert_eq!(ledger.held(), 0);
    }
}
