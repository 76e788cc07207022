//! The simulator's only source of randomness: one ChaCha8 stream per run,
//! seeded from the run's `u64` seed. Nothing else in a run may draw a
//! random number (the OS's, a hasher's), or a seed stops naming a run.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in `0..n` (the modulo bias is below 2^-40 for the `n` used here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.0.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "range {lo}..={hi}");
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}
