//! Random numbers as netem uses them: a fast PRNG producing u32 values, and the correlated
//! generator `get_crandom` (net/sched/sch_netem.c) where each value is a weighted mix of a fresh
//! random number and the previous output.

/// xoshiro256** seeded through splitmix64; deterministic when a seed is given.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// A seed from the kernel's entropy pool (used when the spec has no "seed").
    pub fn from_entropy() -> Rng {
        let mut seed = 0u64;
        let n = unsafe { libc::getrandom(&mut seed as *mut u64 as *mut libc::c_void, 8, 0) };
        if n != 8 {
            seed = crate::now_ns() ^ (std::process::id() as u64) << 32;
        }
        Rng::new(seed)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [0, n).
    #[inline]
    pub fn below(&mut self, n: u32) -> u32 {
        ((self.next_u32() as u64 * n as u64) >> 32) as u32
    }
}

/// Correlated random state (netem's `struct crndstate`): rho is the correlation scaled to u32.
#[derive(Clone, Debug, Default)]
pub struct CRnd {
    pub last: u32,
    pub rho: u32,
}

impl CRnd {
    pub fn new(rho: u32, rng: &mut Rng) -> CRnd {
        CRnd { last: rng.next_u32(), rho }
    }

    /// netem's get_crandom(): answer = (value * (2^32 - rho) + last * rho) >> 32.
    #[inline]
    pub fn next(&mut self, rng: &mut Rng) -> u32 {
        let value = rng.next_u32() as u64;
        if self.rho == 0 {
            return value as u32;
        }
        let rho = self.rho as u64 + 1;
        let answer = ((value * ((1u64 << 32) - rho) + self.last as u64 * rho) >> 32) as u32;
        self.last = answer;
        answer
    }
}

/// Percent (0..100) to netem's u32 probability scale (tc: rint(p * UINT32_MAX)).
pub fn pct_to_u32(pct: f64) -> u32 {
    let p = (pct / 100.0).clamp(0.0, 1.0);
    (p * u32::MAX as f64).round() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_is_deterministic() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn uniform_mean() {
        let mut r = Rng::new(1);
        let n = 200_000;
        let mean: f64 = (0..n).map(|_| r.next_u32() as f64 / u32::MAX as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    }

    #[test]
    fn correlation_raises_autocorrelation() {
        let mut r = Rng::new(3);
        let mut c = CRnd::new(pct_to_u32(75.0), &mut r);
        let xs: Vec<f64> = (0..100_000).map(|_| c.next(&mut r) as f64).collect();
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>();
        let cov = xs.windows(2).map(|w| (w[0] - m) * (w[1] - m)).sum::<f64>();
        let ac = cov / var;
        assert!(ac > 0.6 && ac < 0.9, "lag-1 autocorrelation {ac}");
    }
}
