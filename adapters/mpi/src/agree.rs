//! Every rank checks that it derived the same settings as rank 0.

use crate::MpiError;
use mpi::collective::Root;
use mpi::topology::{Communicator, SimpleCommunicator};

/// Gathers every rank's `hash` at rank 0, which names the first rank whose hash differs
/// from its own; every rank gets the same verdict. Collective: every rank must call it.
pub fn agree_on_settings(world: &SimpleCommunicator, hash: u64) -> Result<(), MpiError> {
    let root = world.process_at_rank(0);
    // [mismatching rank + 1 (0: none), its hash, rank 0's hash]
    let mut verdict = [0u64; 3];
    if world.rank() == 0 {
        let mut hashes = vec![0u64; usize::try_from(world.size()).unwrap_or(0)];
        root.gather_into_root(&hash, &mut hashes[..]);
        if let Some((rank, other)) = hashes.iter().enumerate().find(|(_, h)| **h != hash) {
            verdict = [rank as u64 + 1, *other, hash];
        }
    } else {
        root.gather_into(&hash);
    }
    root.broadcast_into(&mut verdict[..]);
    match verdict {
        [0, _, _] => Ok(()),
        [rank, other, first] => Err(MpiError(format!(
            "rank {} was started with other settings than rank 0 (settings hash {other:016x}, rank 0 has \
             {first:016x}): every rank must get the same command line",
            rank - 1
        ))),
    }
}
