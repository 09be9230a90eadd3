//! Universal Scalability Law fit: `X(N) = λN / (1 + σ(N−1) + κN(N−1))`.
//!
//! σ (contention) and κ (coherency) are constrained to be ≥ 0. For fixed σ, κ
//! the least-squares λ has a closed form (`Σ X·g / Σ g²`, `g = X/λ`), so the
//! fit searches only the (σ, κ) plane: a coarse grid (σ linear, κ
//! log-spaced), then a shrinking pattern search around the best point. This is
//! slower than Gauss–Newton but cannot diverge and honours the constraints.
pub use crate::record::UslFit;

impl UslFit {
    /// Predicted throughput at concurrency `n`.
    pub fn predict(&self, n: f64) -> f64 {
        usl(self.lambda, self.sigma, self.kappa, n)
    }
}

/// `X(N)` for the given parameters.
pub fn usl(lambda: f64, sigma: f64, kappa: f64, n: f64) -> f64 {
    lambda * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))
}

/// Best λ and its sum of squared residuals for fixed σ, κ.
fn lambda_sse(points: &[(f64, f64)], sigma: f64, kappa: f64) -> (f64, f64) {
    let (mut xg, mut gg) = (0.0, 0.0);
    for &(n, x) in points {
        let g = usl(1.0, sigma, kappa, n);
        xg += x * g;
        gg += g * g;
    }
    let lambda = if gg > 0.0 { xg / gg } else { 0.0 };
    let sse = points
        .iter()
        .map(|&(n, x)| (x - lambda * usl(1.0, sigma, kappa, n)).powi(2))
        .sum();
    (lambda, sse)
}

/// Fits the USL to `(concurrency, throughput)` points. Needs more points with
/// positive concurrency than the model's 3 parameters (λ, σ, κ): with 3, any
/// curve fits exactly (R² = 1) and says nothing. Returns `None` otherwise.
pub fn fit_usl(points: &[(f64, f64)]) -> Option<UslFit> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|&(n, x)| n > 0.0 && x.is_finite())
        .collect();
    if pts.len() <= 3 {
        return None;
    }
    // Coarse grid: σ in [0, 1], κ in {0} ∪ 10^[-8, 0].
    let kappas: Vec<f64> = std::iter::once(0.0)
        .chain((0..=64).map(|i| 10f64.powf(-8.0 + 8.0 * f64::from(i) / 64.0)))
        .collect();
    let mut best = (f64::INFINITY, 0.0, 0.0);
    for i in 0..=100 {
        let s = f64::from(i) / 100.0;
        for &k in &kappas {
            let (_, e) = lambda_sse(&pts, s, k);
            if e < best.0 {
                best = (e, s, k);
            }
        }
    }
    // Pattern search: σ step additive, κ step multiplicative (plus trying κ = 0).
    let (mut e, mut s, mut k) = best;
    let (mut ds, mut dk) = (0.01, 10f64.powf(8.0 / 64.0));
    for _ in 0..200 {
        let mut improved = false;
        let k_candidates = [k, k * dk, k / dk, if k == 0.0 { 1e-9 } else { 0.0 }];
        for &cs in &[s, s + ds, s - ds] {
            for &ck in &k_candidates {
                if cs < 0.0 || ck < 0.0 {
                    continue;
                }
                let (_, ce) = lambda_sse(&pts, cs, ck);
                if ce < e {
                    (e, s, k, improved) = (ce, cs, ck, true);
                }
            }
        }
        if !improved {
            ds /= 2.0;
            dk = dk.sqrt();
            if ds < 1e-7 && dk < 1.0 + 1e-7 {
                break;
            }
        }
    }
    let (lambda, sse) = lambda_sse(&pts, s, k);
    let mean = pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64;
    let sst: f64 = pts.iter().map(|p| (p.1 - mean).powi(2)).sum();
    let peak_concurrency = (k > 0.0 && s < 1.0).then(|| ((1.0 - s) / k).sqrt());
    let peak_throughput = match peak_concurrency {
        Some(n) => Some(usl(lambda, s, k, n)),
        None if s > 0.0 => Some(lambda / s),
        None => None,
    };
    Some(UslFit {
        lambda,
        sigma: s,
        kappa: k,
        peak_concurrency,
        peak_throughput,
        r_squared: if sst > 0.0 { 1.0 - sse / sst } else { 1.0 },
        points: pts.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise in [-1, 1).
    fn noise(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    #[test]
    fn recovers_known_parameters_from_noisy_data() {
        let (l, s, k) = (1000.0, 0.05, 0.001);
        let mut seed = 42;
        let pts: Vec<(f64, f64)> = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
            .iter()
            .map(|&n| {
                let n = f64::from(n);
                (n, usl(l, s, k, n) * (1.0 + 0.02 * noise(&mut seed)))
            })
            .collect();
        let f = fit_usl(&pts).unwrap();
        assert!((f.lambda - l).abs() / l < 0.05, "{f:?}");
        assert!((f.sigma - s).abs() < 0.015, "{f:?}");
        assert!((f.kappa - k).abs() / k < 0.3, "{f:?}");
        let peak = f.peak_concurrency.unwrap();
        let true_peak = ((1.0 - s) / k).sqrt(); // ≈ 30.8
        assert!(
            (peak - true_peak).abs() / true_peak < 0.15,
            "{peak} vs {true_peak}"
        );
        assert!(f.r_squared > 0.98, "{f:?}");
    }

    #[test]
    fn linear_scaling_has_zero_contention_and_no_peak() {
        let pts: Vec<(f64, f64)> = (1..=10)
            .map(|n| (f64::from(n), 50.0 * f64::from(n)))
            .collect();
        let f = fit_usl(&pts).unwrap();
        assert!(f.sigma < 1e-3 && f.kappa < 1e-6, "{f:?}");
        assert!((f.lambda - 50.0).abs() < 0.5);
        assert!(f.r_squared > 0.9999);
    }

    #[test]
    fn too_few_points() {
        assert!(fit_usl(&[(1.0, 1.0), (2.0, 2.0)]).is_none());
    }
}
