//! Knee detection (Kneedle, Satopää et al. 2011) on measured curves.
//!
//! Both axes are normalised to [0, 1]; for a concave increasing curve
//! (throughput vs concurrency) the knee is where `y − x` is largest, for a
//! convex increasing curve (latency vs concurrency) where `x − y` is largest.
//! Concurrency sweeps are usually log-spaced (1, 2, 5, 10, 20, ...), so both
//! axes may be taken as logarithms: on log–log axes a flat region has slope 0
//! and pure queueing (latency ∝ N) or linear scaling (throughput ∝ N) slope 1,
//! so the knee is a clean corner, and the wide gaps at high load do not pull
//! it towards the top step.

use serde::{Deserialize, Serialize};

/// Shape of the curve being searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Rises fast then flattens (throughput vs load).
    Concave,
    /// Flat then rises fast (latency vs load).
    Convex,
}

/// Index of the knee in `points` (sorted by x), or `None` when the curve has
/// fewer than 3 points, is flat, or shows no knee (maximum difference ≤ 0).
pub fn kneedle(points: &[(f64, f64)], shape: Shape, log_axes: bool) -> Option<usize> {
    if points.len() < 3 {
        return None;
    }
    let axis = |v: f64| if log_axes { v.max(1e-12).log2() } else { v };
    let xs: Vec<f64> = points.iter().map(|p| axis(p.0)).collect();
    let ys: Vec<f64> = points.iter().map(|p| axis(p.1)).collect();
    let norm = |v: &[f64]| -> Option<Vec<f64>> {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (hi > lo).then(|| v.iter().map(|x| (x - lo) / (hi - lo)).collect())
    };
    let (xn, yn) = (norm(&xs)?, norm(&ys)?);
    let mut best: Option<(usize, f64)> = None;
    for i in 0..points.len() {
        let d = match shape {
            Shape::Concave => yn[i] - xn[i],
            Shape::Convex => xn[i] - yn[i],
        };
        if d > 1e-9 && best.is_none_or(|(_, b)| d > b) {
            best = Some((i, d));
        }
    }
    best.map(|(i, _)| i)
}

/// Whether a sweep is wide enough to look at on log axes (max/min ≥ 8).
pub fn prefers_log_x(points: &[(f64, f64)]) -> bool {
    let lo = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let hi = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    lo > 0.0 && hi / lo >= 8.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_throughput_knee_on_linear_axis() {
        // Linear up to 10, then almost flat.
        let pts: Vec<(f64, f64)> = (1..=40)
            .map(|n| {
                let n = f64::from(n);
                (
                    n,
                    if n <= 10.0 {
                        n * 100.0
                    } else {
                        1000.0 + 5.0 * (n - 10.0)
                    },
                )
            })
            .collect();
        let i = kneedle(&pts, Shape::Concave, false).unwrap();
        assert_eq!(pts[i].0, 10.0);
    }

    #[test]
    fn finds_latency_knee_on_log_axes() {
        // Seed-000-like sweep: flat latency up to 20, then linear in concurrency (queueing).
        let ns = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 400.0];
        let pts: Vec<(f64, f64)> = ns
            .iter()
            .map(|&n: &f64| (n, 5.0 + (n - 20.0).max(0.0) * 0.5))
            .collect();
        assert!(prefers_log_x(&pts));
        let i = kneedle(&pts, Shape::Convex, true).unwrap();
        assert_eq!(pts[i].0, 20.0, "knee at {:?}", pts[i]);
    }

    #[test]
    fn finds_throughput_knee_on_log_axes() {
        // Linear scaling to 16, flat after.
        let ns = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
        let pts: Vec<(f64, f64)> = ns.iter().map(|&n: &f64| (n, 100.0 * n.min(16.0))).collect();
        let i = kneedle(&pts, Shape::Concave, true).unwrap();
        assert_eq!(pts[i].0, 16.0);
    }

    #[test]
    fn straight_line_has_no_knee() {
        let pts: Vec<(f64, f64)> = (1..=10).map(|n| (f64::from(n), f64::from(n))).collect();
        assert_eq!(kneedle(&pts, Shape::Concave, false), None);
        assert_eq!(kneedle(&pts[..2], Shape::Concave, false), None);
    }
}
