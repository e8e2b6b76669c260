//! Confidence intervals for a weighted p75 and for the difference of two (`collector report
//! --compare` and `--deploy`, contract v5 §1).
//!
//! **The p75's interval** is the distribution-free order-statistic interval (the binomial
//! interval for a quantile: Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2), in
//! its weighted form, Woodruff's interval (Woodruff 1952, JASA 47:635; Sitter and Wu 2001,
//! Biometrika 88:1195, on why its coverage holds). Among `n` independent page views the number
//! at or below the true p75 is Binomial(n, 0.75), so the values at the ranks
//! `n · 0.75 ∓ (1.96 · √(n · 0.75 · 0.25) + 1)` bound it with about 95 % probability, whatever
//! the distribution. With rows weighted by `w = 1 / sample_rate`, the share of page views at or
//! below a value `q` is estimated by `F(q) = Σ w·[x ≤ q] / Σw`, whose variance at the p75 is
//! `V = Σ w² ([x ≤ p75] − 0.75)² / (Σw)²` (the rows are independent draws; no assumption that
//! the rate is unrelated to the value: a site sampled harder while it is slow is covered). The
//! interval is then the weighted quantiles (`quantileExactWeighted`'s definition,
//! [`weighted_quantile`]) at the levels `0.75 ∓ (1.96 · √V + 1 / n)`, `n = 0.75 · 0.25 / V` the
//! effective size ([`effective_size`]): with equal weights exactly the binomial ranks above.
//! The `+ 1` rank is the continuity correction that keeps the normal approximation of the
//! binomial from falling under 95 %. ClickHouse computes everything over every row of the
//! group (three aggregations: the p75 and the sums, `V`, the two quantiles); nothing is
//! sampled, no row is fetched.
//!
//! **The difference's interval** (Price and Bonett 2002, "Distribution-free confidence intervals
//! for difference and ratio of medians", J. Stat. Comput. Simul. 72:119): each p75's standard
//! error is read off its interval (`(high − low) / (2 · 1.96)`), the two groups are independent
//! page views, so the difference B − A has the standard error `√(se_A² + se_B²)` and the 95 %
//! interval `B − A ∓ 1.96 · se`. The difference is **real** when that interval excludes 0.
//!
//! Why the coverage is right, and how it was checked: the unit tests below draw, with fixed
//! seeds, thousands of samples of known distributions (log-normal LCPs, rows at sampling rates
//! 1, 0.5 and 0.1, some with the rate lowered on the slow half of the traffic as a site over its
//! budget is sampled) and count how often the 95 % intervals hold the true p75 and the true
//! difference: 95 % within the stated tolerance (docs/queries.md, "Comparisons with
//! confidence", gives the figures).

/// The standard normal quantile of 0.975: a two-sided 95 % interval is ± this many standard
/// errors.
pub const Z95: f64 = 1.959_963_984_540_054;

/// The quantile the report shows.
pub const P75: f64 = 0.75;

/// The levels of the weighted distribution whose quantiles bound the p75 with 95 %
/// confidence, for `n_eff` effective page views (module doc); each within `[0, 1]`.
pub fn interval_levels(n_eff: f64) -> (f64, f64) {
    if n_eff <= 0.0 || !n_eff.is_finite() {
        return (0.0, 1.0);
    }
    let half = (Z95 * (n_eff * P75 * (1.0 - P75)).sqrt() + 1.0) / n_eff;
    ((P75 - half).max(0.0), (P75 + half).min(1.0))
}

/// The effective size of a group whose weights sum to `sum`, from `spread`, the sum over its
/// rows of `w² ([x ≤ p75] − 0.75)²` (module doc): `0.75 · 0.25 · sum² / spread`, the rows
/// themselves when every weight is equal. 0 without rows; without spread (every row on one
/// side of the p75 at exactly its level), `sum² / 1`: as many as the weights say.
pub fn effective_size(sum: f64, spread: f64) -> f64 {
    match (sum > 0.0, spread > 0.0) {
        (false, _) => 0.0,
        (true, true) => P75 * (1.0 - P75) * sum * sum / spread,
        (true, false) => sum,
    }
}

/// The `spread` of [`effective_size`] of one row of weight `w` and value `x`, given the p75.
pub fn spread_term(w: f64, x: f64, p75: f64) -> f64 {
    let below = if x <= p75 { 1.0 } else { 0.0 };
    w * w * (below - P75) * (below - P75)
}

/// The weighted quantile as ClickHouse's `quantileExactWeighted(level)` defines it: the
/// smallest value whose cumulative weight reaches `ceil(level · total)`. `None` without values.
pub fn weighted_quantile(values: &mut [(f64, u64)], level: f64) -> Option<f64> {
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    sorted_quantile(values, level)
}

/// A p75 with its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// The weighted p75.
    pub p75: f64,
    /// The interval's lower end.
    pub low: f64,
    /// Its upper end.
    pub high: f64,
}

impl Estimate {
    /// The standard error the interval implies (`(high − low) / (2 · 1.96)`).
    pub fn standard_error(&self) -> f64 {
        (self.high - self.low) / (2.0 * Z95)
    }
}

/// The difference B − A of two p75s with its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Difference {
    /// `b.p75 − a.p75`.
    pub difference: f64,
    /// The interval's lower end.
    pub low: f64,
    /// Its upper end.
    pub high: f64,
    /// Whether the interval excludes 0.
    pub real: bool,
}

/// The difference `b − a` of two independent groups' p75s (module doc).
pub fn difference(a: &Estimate, b: &Estimate) -> Difference {
    let d = b.p75 - a.p75;
    let se = a.standard_error().hypot(b.standard_error());
    let (low, high) = (d - Z95 * se, d + Z95 * se);
    Difference {
        difference: d,
        low,
        high,
        real: low > 0.0 || high < 0.0,
    }
}

/// The p75 and its interval from one group's rows, `(value, sample_rate)`, weighted as the
/// report weights them (`round(1000 / sample_rate)` for the quantiles, `1 / sample_rate` for
/// the effective size): what ClickHouse computes for `--compare`, done here for the tests.
pub fn estimate(rows: &[(f64, f64)]) -> Option<Estimate> {
    let mut values: Vec<(f64, u64)> = rows
        .iter()
        .map(|&(v, r)| (v, (1000.0 / r).round() as u64))
        .collect();
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let p75 = sorted_quantile(&values, P75)?;
    let sum: f64 = rows.iter().map(|(_, r)| 1.0 / r).sum();
    let spread: f64 = rows
        .iter()
        .map(|&(x, r)| spread_term(1.0 / r, x, p75))
        .sum();
    let (lo, hi) = interval_levels(effective_size(sum, spread));
    Some(Estimate {
        p75,
        low: sorted_quantile(&values, lo)?,
        high: sorted_quantile(&values, hi)?,
    })
}

/// [`weighted_quantile`] of values already sorted.
fn sorted_quantile(values: &[(f64, u64)], level: f64) -> Option<f64> {
    let total: u64 = values.iter().map(|v| v.1).sum();
    let threshold = (level * total as f64).ceil();
    let mut acc = 0.0;
    for &(v, w) in values {
        acc += w as f64;
        if acc >= threshold {
            return Some(v);
        }
    }
    values.last().map(|v| v.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A standard normal draw (Box–Muller).
    fn normal(rng: &mut StdRng) -> f64 {
        let (u, v): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// The standard normal quantile of 0.75.
    const Z75: f64 = 0.674_489_750_196_081_7;

    /// A traffic of page views whose LCP is log-normal (`exp(mu + sigma · N)` ms), a `slow`
    /// share of them `shift` log units slower; rows drawn at `rate_fast` for the others and
    /// `rate_slow` for the slow ones (a site sampled harder while it is slow).
    #[derive(Clone, Copy)]
    struct Traffic {
        mu: f64,
        slow: f64,
        shift: f64,
        rate_fast: f64,
        rate_slow: f64,
    }

    const SIGMA: f64 = 0.5;

    impl Traffic {
        /// One stored row `(lcp, sample_rate)`: a page view is drawn from the traffic and kept
        /// with its rate's probability.
        fn row(&self, rng: &mut StdRng) -> (f64, f64) {
            loop {
                let slow = rng.gen::<f64>() < self.slow;
                let rate = if slow { self.rate_slow } else { self.rate_fast };
                if rng.gen::<f64>() < rate {
                    let mu = self.mu + if slow { self.shift } else { 0.0 };
                    return ((mu + SIGMA * normal(rng)).exp(), rate);
                }
            }
        }

        fn rows(&self, rng: &mut StdRng, n: usize) -> Vec<(f64, f64)> {
            (0..n).map(|_| self.row(rng)).collect()
        }

        /// The share of the traffic's page views at or below `x`.
        fn cdf(&self, x: f64) -> f64 {
            let phi = |z: f64| 0.5 * erfc(-z / std::f64::consts::SQRT_2);
            let z = (x.ln() - self.mu) / SIGMA;
            (1.0 - self.slow) * phi(z) + self.slow * phi(z - self.shift / SIGMA)
        }

        /// The traffic's true p75 (bisection on the CDF).
        fn p75(&self) -> f64 {
            let (mut lo, mut hi): (f64, f64) = (1e-3, 1e7);
            for _ in 0..200 {
                let mid = (lo * hi).sqrt();
                if self.cdf(mid) < P75 {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            hi
        }
    }

    /// The complementary error function (Numerical Recipes' `erfcc`, relative error < 1.2e-7).
    fn erfc(x: f64) -> f64 {
        let z = x.abs();
        let t = 1.0 / (1.0 + 0.5 * z);
        let r = t
            * (-z * z - 1.265_512_23
                + t * (1.000_023_68
                    + t * (0.374_091_96
                        + t * (0.096_784_18
                            + t * (-0.186_288_06
                                + t * (0.278_868_07
                                    + t * (-1.135_203_98
                                        + t * (1.488_515_87
                                            + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
                .exp();
        if x >= 0.0 {
            r
        } else {
            2.0 - r
        }
    }

    /// An unsampled traffic of one log-normal LCP with a median of 2 s.
    const PLAIN: Traffic = Traffic {
        mu: 7.6,
        slow: 0.0,
        shift: 0.0,
        rate_fast: 1.0,
        rate_slow: 1.0,
    };
    /// Rows at rates 1 and 0.1, the slow half (0.3 log units slower) sampled at 0.1.
    const SAMPLED_WHEN_SLOW: Traffic = Traffic {
        mu: 7.6,
        slow: 0.5,
        shift: 0.3,
        rate_fast: 1.0,
        rate_slow: 0.1,
    };
    /// Rows at 0.5 whatever the page view.
    const HALF: Traffic = Traffic {
        rate_fast: 0.5,
        rate_slow: 0.5,
        ..SAMPLED_WHEN_SLOW
    };

    #[test]
    fn the_quantile_is_clickhouses_definition() {
        let mut v = vec![(3.0, 1), (1.0, 1), (2.0, 1), (4.0, 1)];
        assert_eq!(weighted_quantile(&mut v, 0.75), Some(3.0));
        let mut w = vec![(1.0, 3000), (10.0, 1000)];
        assert_eq!(weighted_quantile(&mut w, 0.75), Some(1.0));
        assert_eq!(weighted_quantile(&mut w, 0.76), Some(10.0));
        assert_eq!(weighted_quantile(&mut [], 0.75), None);
        assert_eq!(interval_levels(0.0), (0.0, 1.0));
        let (lo, hi) = interval_levels(10_000.0);
        assert!(
            (0.741..0.742).contains(&lo) && (0.758..0.759).contains(&hi),
            "{lo} {hi}"
        );
        // 4 rows of weight 1, 3 at or below the p75: 0.25² · 3 + 0.75² = 0.75 = 4 · 0.1875.
        let spread: f64 = [1.0, 2.0, 3.0, 4.0]
            .iter()
            .map(|&x| spread_term(1.0, x, 3.0))
            .sum();
        assert!(
            (effective_size(4.0, spread) - 4.0).abs() < 1e-12,
            "equal weights: the rows"
        );
        assert_eq!(effective_size(0.0, 0.0), 0.0);
    }

    /// How often, over `trials` seeded samples of `n` rows, the p75's interval holds the
    /// traffic's true p75.
    fn p75_coverage(traffic: Traffic, n: usize, trials: usize, seed: u64) -> f64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let truth = traffic.p75();
        let held = (0..trials)
            .filter(|_| {
                let e = estimate(&traffic.rows(&mut rng, n)).unwrap();
                e.low <= truth && truth <= e.high
            })
            .count();
        held as f64 / trials as f64
    }

    /// The tolerance of a coverage: 95 % ± 2.5 points (over 2,000 trials a coverage of
    /// exactly 95 % lands within ± 1.0 point 85 % of the time and within ± 2.5 points
    /// always but once in a million; the rest of the margin is the method's own
    /// approximation at these sizes).
    const COVERAGE: std::ops::RangeInclusive<f64> = 0.925..=0.975;

    #[test]
    fn the_p75s_interval_holds_the_true_p75_95_times_in_100() {
        let truth_plain = PLAIN.p75();
        let analytic = (7.6 + SIGMA * Z75).exp();
        assert!(
            (truth_plain - analytic).abs() < 1e-6 * analytic,
            "{truth_plain}"
        );
        for (name, traffic, n, seed) in [
            ("unsampled, 100 rows", PLAIN, 100, 1),
            ("unsampled, 2,000 rows", PLAIN, 2000, 2),
            ("all at 0.5, 500 rows", HALF, 500, 3),
            ("slow half at 0.1, 500 rows", SAMPLED_WHEN_SLOW, 500, 4),
            ("slow half at 0.1, 2,000 rows", SAMPLED_WHEN_SLOW, 2000, 5),
        ] {
            let c = p75_coverage(traffic, n, 2000, seed);
            println!("p75 interval coverage, {name}: {:.1} %", c * 100.0);
            assert!(COVERAGE.contains(&c), "{name}: {c}");
        }
    }

    /// Over 2,000 seeded pairs of samples of two traffics, how often the difference's
    /// interval holds the true difference, and how often it is marked real.
    fn difference_coverage(a: Traffic, b: Traffic, n: usize, seed: u64) -> (f64, f64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let truth = b.p75() - a.p75();
        let (mut held, mut real) = (0, 0);
        let trials = 2000;
        for _ in 0..trials {
            let ea = estimate(&a.rows(&mut rng, n)).unwrap();
            let eb = estimate(&b.rows(&mut rng, n)).unwrap();
            let d = difference(&ea, &eb);
            held += usize::from(d.low <= truth && truth <= d.high);
            real += usize::from(d.real);
        }
        (held as f64 / trials as f64, real as f64 / trials as f64)
    }

    #[test]
    fn the_differences_interval_holds_the_true_difference_95_times_in_100() {
        let slower = Traffic {
            mu: SAMPLED_WHEN_SLOW.mu + 0.1,
            ..SAMPLED_WHEN_SLOW
        };
        for (name, a, b, seed) in [
            ("one traffic twice, unsampled", PLAIN, PLAIN, 11),
            (
                "one traffic twice, slow half at 0.1",
                SAMPLED_WHEN_SLOW,
                SAMPLED_WHEN_SLOW,
                12,
            ),
            (
                "B 10 % slower, slow half at 0.1",
                SAMPLED_WHEN_SLOW,
                slower,
                13,
            ),
        ] {
            let (c, real) = difference_coverage(a, b, 1000, seed);
            println!(
                "difference coverage, {name}: {:.1} %, marked real {:.1} %",
                c * 100.0,
                real * 100.0
            );
            assert!(COVERAGE.contains(&c), "{name}: {c}");
        }
    }

    /// Two samples of one traffic (2,000 rows each, the slow half sampled at 0.1): the
    /// difference is marked not real in at least 95 of 100 seeded trials.
    #[test]
    fn two_samples_of_one_traffic_are_not_real_in_95_of_100_trials() {
        let mut rng = StdRng::seed_from_u64(54);
        let not_real = (0..100)
            .filter(|_| {
                let a = estimate(&SAMPLED_WHEN_SLOW.rows(&mut rng, 2000)).unwrap();
                let b = estimate(&SAMPLED_WHEN_SLOW.rows(&mut rng, 2000)).unwrap();
                !difference(&a, &b).real
            })
            .count();
        println!("one traffic twice: not real in {not_real} of 100");
        assert!(not_real >= 95, "{not_real}");
    }

    /// A release 300 ms slower at p75 (every page view 300 ms slower), 2,000 views each: real,
    /// and the interval holds the 300 ms.
    #[test]
    fn a_release_300_ms_slower_is_real_and_its_interval_holds_300_ms() {
        let mut rng = StdRng::seed_from_u64(300);
        let a = PLAIN.rows(&mut rng, 2000);
        let b: Vec<(f64, f64)> = PLAIN
            .rows(&mut rng, 2000)
            .into_iter()
            .map(|(v, r)| (v + 300.0, r))
            .collect();
        let d = difference(&estimate(&a).unwrap(), &estimate(&b).unwrap());
        println!("300 ms slower: {d:?}");
        assert!(d.real, "{d:?}");
        assert!(d.low <= 300.0 && 300.0 <= d.high, "{d:?}");
    }
}
