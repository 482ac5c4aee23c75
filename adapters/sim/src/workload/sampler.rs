//! Seeded minibatch sampling: epochs over a shuffled permutation of the rows.

use syncopate::rng::Rng;

/// PRNG sub-stream used by [`BatchSampler`].
const SAMPLER_STREAM: u64 = 0x5341_4d50_4c45; // "SAMPLE"

/// Draws minibatch row indices for one worker: walks a seeded random permutation of `0..n`
/// and reshuffles at the end of every epoch, so every row is used exactly once per epoch. A
/// batch that crosses an epoch boundary takes the rest of one epoch and the start of the next.
#[derive(Clone, Debug)]
pub struct BatchSampler {
    order: Vec<usize>,
    next: usize,
    epochs: u64,
    rng: Rng,
}

impl BatchSampler {
    /// A sampler over `0..n` seeded with `seed` (give each worker its own seed).
    pub fn new(n: usize, seed: u64) -> Self {
        let mut rng = Rng::derive(seed, SAMPLER_STREAM);
        let mut order: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut order);
        Self { order, next: 0, epochs: 0, rng }
    }

    /// Replaces the contents of `out` with the next `size` indices (empty when `n == 0`).
    /// Does not allocate once `out` has capacity `size`.
    pub fn next_batch(&mut self, size: usize, out: &mut Vec<usize>) {
        out.clear();
        if self.order.is_empty() {
            return;
        }
        out.reserve(size);
        while out.len() < size {
            if self.next == self.order.len() {
                self.rng.shuffle(&mut self.order);
                self.next = 0;
                self.epochs += 1;
            }
            let take = (size - out.len()).min(self.order.len() - self.next);
            out.extend_from_slice(&self.order[self.next..self.next + take]);
            self.next += take;
        }
    }

    /// Number of rows sampled from (`n`).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no rows to sample.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Number of completed epochs after which a new one has been started.
    pub fn epochs(&self) -> u64 {
        self.epochs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once_per_epoch() {
        for (n, size) in [(10, 3), (10, 10), (10, 1), (7, 20), (1797, 32)] {
            let mut s = BatchSampler::new(n, 9);
            let mut batch = Vec::new();
            let mut drawn = Vec::new();
            while drawn.len() < 4 * n {
                s.next_batch(size, &mut batch);
                assert_eq!(batch.len(), size);
                drawn.extend_from_slice(&batch);
            }
            let epochs: Vec<Vec<usize>> = drawn.chunks_exact(n).take(4).map(<[usize]>::to_vec).collect();
            for epoch in &epochs {
                let mut sorted = epoch.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} size {size}");
            }
            // Reshuffled each epoch.
            assert!(epochs.windows(2).any(|w| w[0] != w[1]), "n {n} size {size}");
            assert!(s.epochs() >= 3);
            assert_eq!(s.len(), n);
        }
    }

    #[test]
    fn seeded_and_distinct_per_seed() {
        let draw = |seed| {
            let mut s = BatchSampler::new(100, seed);
            let mut b = Vec::new();
            (0..10)
                .flat_map(|_| {
                    s.next_batch(16, &mut b);
                    b.clone()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert_ne!(draw(1)[..100], (0..100).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn empty_sampler_gives_empty_batches() {
        let mut s = BatchSampler::new(0, 1);
        let mut b = vec![5];
        s.next_batch(8, &mut b);
        assert!(b.is_empty() && s.is_empty());
        let mut s = BatchSampler::new(3, 1);
        s.next_batch(0, &mut b);
        assert!(b.is_empty());
    }
}
