//! Rolling per-(route, model) output-token sketches.
//!
//! One [`RollingDigest`] per (route, model, *source log partition*): events from
//! different log partitions arrive in no fixed interleaving, so each source keeps
//! its own sketch and queries merge them in log-partition order ([`merged`]).
//! Within a source, samples arrive in log order, so the state is a pure function
//! of the log and the same log gives the same bytes.
//!
//! The window: two generations of digests. Samples go to `current`; when it holds
//! [`GENERATION_SAMPLES`] it becomes `previous` and a fresh `current` starts. A
//! query covers `previous + current`, i.e. between the last `WINDOW_SAMPLES / 2`
//! and `WINDOW_SAMPLES` settlements of the source. Rotation depends only on sample
//! counts, never on batch boundaries or clocks.
//!
//! The t-digest is the `tdigests` crate, which builds digests from centroids and
//! compresses them; it has no single-value insert, so samples are buffered
//! (at most [`BUFFER_SAMPLES`]) and folded in with one merge + compress.

use tdigests::{Centroid, TDigest};

/// Settled samples the window covers at most, per source log partition.
pub const WINDOW_SAMPLES: u64 = 4_000;
/// Samples per generation: the window holds between one and two generations.
pub const GENERATION_SAMPLES: u64 = WINDOW_SAMPLES / 2;
/// Raw samples buffered before they are folded into the current digest.
pub const BUFFER_SAMPLES: usize = 64;
/// Centroids each generation keeps after compression.
pub const MAX_CENTROIDS: usize = 300;

const FORMAT_VERSION: u8 = 1;

/// The sketch of one source log partition's settled output tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RollingDigest {
    previous: Vec<Centroid>,
    previous_samples: u64,
    current: Vec<Centroid>,
    /// Samples in `current` plus `buffer`.
    current_samples: u64,
    buffer: Vec<u64>,
    /// Every sample ever observed (not only the window).
    lifetime_samples: u64,
}

impl RollingDigest {
    pub fn observe(&mut self, units: u64) {
        self.buffer.push(units);
        self.current_samples += 1;
        self.lifetime_samples += 1;
        if self.buffer.len() >= BUFFER_SAMPLES || self.current_samples >= GENERATION_SAMPLES {
            self.fold_buffer();
        }
        if self.current_samples >= GENERATION_SAMPLES {
            self.previous = std::mem::take(&mut self.current);
            self.previous_samples = self.current_samples;
            self.current_samples = 0;
        }
    }

    fn fold_buffer(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let mut centroids = std::mem::take(&mut self.current);
        centroids.extend(self.buffer.drain(..).map(|u| Centroid::new(u as f64, 1.0)));
        let mut digest = TDigest::from_centroids(centroids);
        digest.compress(MAX_CENTROIDS);
        self.current = digest.centroids().to_vec();
    }

    /// Samples the window currently covers.
    pub fn window_samples(&self) -> u64 {
        self.previous_samples + self.current_samples
    }

    pub fn lifetime_samples(&self) -> u64 {
        self.lifetime_samples
    }

    /// Every centroid of the window, buffered samples as weight-1 centroids.
    fn window_centroids(&self) -> impl Iterator<Item = Centroid> + '_ {
        self.previous
            .iter()
            .chain(self.current.iter())
            .cloned()
            .chain(self.buffer.iter().map(|&u| Centroid::new(u as f64, 1.0)))
    }

    /// Fixed little-endian binary encoding (version, counts, centroids as f64 bits).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            1 + 8 * 6 + 16 * (self.previous.len() + self.current.len()) + 8 * self.buffer.len(),
        );
        out.push(FORMAT_VERSION);
        for n in [
            self.previous_samples,
            self.current_samples,
            self.lifetime_samples,
            self.previous.len() as u64,
            self.current.len() as u64,
            self.buffer.len() as u64,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for c in self.previous.iter().chain(self.current.iter()) {
            out.extend_from_slice(&c.mean.to_bits().to_le_bytes());
            out.extend_from_slice(&c.weight.to_bits().to_le_bytes());
        }
        for u in &self.buffer {
            out.extend_from_slice(&u.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut words = bytes
            .get(1..)
            .ok_or("empty digest")?
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8")));
        if bytes[0] != FORMAT_VERSION || bytes.len() % 8 != 1 {
            return Err(format!("unknown digest format {}", bytes[0]));
        }
        let mut next = || words.next().ok_or_else(|| "truncated digest".to_string());
        let (previous_samples, current_samples, lifetime_samples) = (next()?, next()?, next()?);
        let (np, nc, nb) = (next()?, next()?, next()?);
        let limit = (MAX_CENTROIDS + BUFFER_SAMPLES) as u64;
        if np > limit || nc > limit || nb > BUFFER_SAMPLES as u64 {
            return Err("digest sizes out of range".into());
        }
        let mut centroids = |n: u64| -> Result<Vec<Centroid>, String> {
            (0..n)
                .map(|_| {
                    Ok(Centroid::new(
                        f64::from_bits(next()?),
                        f64::from_bits(next()?),
                    ))
                })
                .collect()
        };
        let previous = centroids(np)?;
        let current = centroids(nc)?;
        let buffer = (0..nb).map(|_| next()).collect::<Result<Vec<_>, _>>()?;
        if next().is_ok() {
            return Err("trailing bytes after digest".into());
        }
        Ok(Self {
            previous,
            previous_samples,
            current,
            current_samples,
            buffer,
            lifetime_samples,
        })
    }
}

/// Merges the window of several sources, in the order given (callers pass them
/// in log-partition order, so the result does not depend on arrival order).
/// `None` when no source has a sample.
pub fn merged<'a>(sources: impl IntoIterator<Item = &'a RollingDigest>) -> Option<TDigest> {
    let centroids: Vec<Centroid> = sources
        .into_iter()
        .flat_map(|d| d.window_centroids())
        .collect();
    if centroids.is_empty() {
        return None;
    }
    Some(TDigest::from_centroids(centroids))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic skewed generator (xorshift64*), no runtime randomness: nine
    /// in ten outputs log-normal-ish around 1,700 tokens, one in ten uniform
    /// over [200, 4000], all clipped to [200, 4000].
    pub(crate) fn synthetic_outputs(seed: u64, n: usize) -> Vec<u64> {
        let mut state = seed.max(1);
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let v = if next() < 0.1 {
                    200.0 + 3_800.0 * next()
                } else {
                    // Sum of six uniforms ≈ normal; exponentiate for skew.
                    let z: f64 = (0..6).map(|_| next()).sum::<f64>() - 3.0;
                    (7.45 + 0.45 * z).exp()
                };
                (v.round() as u64).clamp(200, 4_000)
            })
            .collect()
    }

    /// Mid-rank of `x` among sorted samples: (#< x + #<= x) / 2n.
    fn rank(sorted: &[u64], x: f64) -> f64 {
        let below = sorted.partition_point(|&v| (v as f64) < x);
        let at_or_below = sorted.partition_point(|&v| (v as f64) <= x);
        (below + at_or_below) as f64 / 2.0 / sorted.len() as f64
    }

    /// The accuracy bar: p50/p90/p99 (and p75) within 1% relative rank
    /// error of the exact quantiles of the window, state under 16 KiB per route.
    #[test]
    fn estimator_accuracy_and_size() {
        for seed in [0x5EED, 7, 0xDEAD_BEEF] {
            let samples = synthetic_outputs(seed, 10_000 + seed as usize % 1_000);
            let mut digest = RollingDigest::default();
            for &s in &samples {
                digest.observe(s);
            }
            let window = digest.window_samples() as usize;
            let mut exact: Vec<u64> = samples[samples.len() - window..].to_vec();
            exact.sort_unstable();
            let merged = merged([&digest]).unwrap();
            let bytes = digest.encode().len();
            println!(
                "seed {seed:#x}: window {window} samples, min {} max {} mean {:.0}, state {bytes} bytes",
                exact[0],
                exact[window - 1],
                exact.iter().sum::<u64>() as f64 / window as f64
            );
            for q in [0.5, 0.75, 0.9, 0.99] {
                let estimate = merged.estimate_quantile(q);
                let exact_value = exact[((q * window as f64).ceil() as usize).min(window) - 1];
                let rank_error = (rank(&exact, estimate) - q).abs();
                println!(
                    "  p{:<2} estimate {estimate:>8.1} exact {exact_value:>5} rank error {:.3}%",
                    (q * 100.0) as u32,
                    rank_error * 100.0
                );
                assert!(rank_error < 0.01, "q {q}: rank error {rank_error}");
            }
            assert!(bytes < 16 * 1024, "{bytes} bytes per route");
            assert_eq!(RollingDigest::decode(&digest.encode()).unwrap(), digest);
        }
        // Worst case size: both generations full of centroids and a full buffer.
        let worst = 1 + 6 * 8 + 2 * MAX_CENTROIDS * 16 + BUFFER_SAMPLES * 8;
        println!("worst-case state {worst} bytes");
        assert!(worst < 16 * 1024, "worst case {worst} bytes");
    }

    #[test]
    fn window_rotates_by_count_only() {
        let mut d = RollingDigest::default();
        for i in 0..GENERATION_SAMPLES {
            d.observe(i);
        }
        assert_eq!(d.window_samples(), GENERATION_SAMPLES);
        for i in 0..GENERATION_SAMPLES + 5 {
            d.observe(i);
        }
        assert_eq!(d.window_samples(), GENERATION_SAMPLES + 5);
        assert_eq!(d.lifetime_samples(), 2 * GENERATION_SAMPLES + 5);
        assert!(RollingDigest::decode(&[9, 0]).is_err());
        assert!(RollingDigest::decode(&d.encode()[..20]).is_err());
    }
}
