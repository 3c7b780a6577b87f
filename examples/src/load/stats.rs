//! Percentiles and means of latency samples.

use serde::Serialize;

/// The `p`-th percentile (0..=100) of `sorted` (ascending), interpolated linearly between the two
/// nearest ranks (rank `p / 100 * (n - 1)`, NumPy's default); `None` when empty.
///
/// ```
/// use cuda_async_examples::load::percentile;
/// assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.5));
/// assert_eq!(percentile(&[], 50.0), None);
/// ```
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let w = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * w)
}

/// p50, p90, p99 and mean of a set of samples (milliseconds in the reports); all `None` when
/// there are none.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Arithmetic mean.
    pub mean: Option<f64>,
}

impl Summary {
    /// The summary of `samples` (any order; NaNs are dropped).
    ///
    /// ```
    /// use cuda_async_examples::load::Summary;
    /// let s = Summary::of(&[3.0, 1.0, 2.0]);
    /// assert_eq!((s.p50, s.mean), (Some(2.0), Some(2.0)));
    /// ```
    pub fn of(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let mean = (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        Summary { p50: percentile(&v, 50.0), p90: percentile(&v, 90.0), p99: percentile(&v, 99.0), mean }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_against_a_direct_computation() {
        // 1..=100: p50 = 50.5, p90 = 90.1, p99 = 99.01 with linear interpolation.
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&v);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        assert!(
            close(s.p50, 50.5) && close(s.p90, 90.1) && close(s.p99, 99.01) && close(s.mean, 50.5),
            "{s:?}"
        );
        assert_eq!(
            Summary::of(&[7.0]),
            Summary { p50: Some(7.0), p90: Some(7.0), p99: Some(7.0), mean: Some(7.0) }
        );
        assert_eq!(Summary::of(&[f64::NAN]).p50, None);
        let sorted = [0.0, 10.0];
        assert_eq!(percentile(&sorted, 0.0), Some(0.0));
        assert_eq!(percentile(&sorted, 100.0), Some(10.0));
        assert_eq!(percentile(&sorted, 25.0), Some(2.5));
        assert_eq!(percentile(&sorted, 250.0), Some(10.0), "clamped");
    }
}
