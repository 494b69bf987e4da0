//! SplitMix64, the crate's one seedable mixer and generator: the loader's sampler keys its
//! permutations with [`mix64`], MinHash draws its permutation parameters with [`splitmix64`],
//! and fixtures and demo data use [`SplitMix64`]. Not cryptographic.

/// The golden-ratio increment of SplitMix64.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser (Stafford's variant 13): a strong 64-bit mixer.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 output for state `seed` at step `i` (stateless: step `i` of a generator
/// whose state starts at `seed`).
#[inline]
pub fn splitmix64(seed: u64, i: u64) -> u64 {
    mix64(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed ^ 0x6A09_E667_F3BC_C909)
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(1e-300);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_and_stateless_form_agree() {
        let mut g = SplitMix64::new(5);
        for i in 0..10 {
            assert_eq!(g.next_u64(), splitmix64(5 ^ 0x6A09_E667_F3BC_C909, i));
        }
        // The reference SplitMix64 sequence for state 0 (Vigna's splitmix64.c).
        assert_eq!(splitmix64(0, 0), 0xE220_A839_7B1D_CDAF);
    }
}
