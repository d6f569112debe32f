//! Statistics for the sampling tests: whether two samples of outcomes could come from one
//! distribution (χ² homogeneity).

use super::server::post;
use serde_json::Value;
use std::collections::HashMap;

/// Samples of completions of `body` (a `/v1/completions` request with `n`, `max_tokens` and
/// `logprobs`) from `url`: `waves` waves of ten requests, each with a seed of its own; the
/// outcomes are each choice's first `keep` tokens, counted.
pub async fn sample_prefixes(
    url: &str,
    body: &Value,
    waves: u64,
    keep: usize,
) -> HashMap<String, usize> {
    let n = body["n"].as_u64().unwrap_or(1);
    let mut counts: HashMap<String, usize> = HashMap::new();
    // Ten requests at a time: within the server's admission capacity.
    for wave in 0..waves {
        let tasks: Vec<_> = (0..10u64)
            .map(|j| {
                let (url, mut body) = (url.to_string(), body.clone());
                body["seed"] = ((wave * 10 + j) * n).into();
                tokio::spawn(async move { post(&url, body).await })
            })
            .collect();
        for t in tasks {
            let (status, v) = t.await.unwrap();
            assert_eq!(status, 200, "{v}");
            for c in v["choices"].as_array().unwrap() {
                let tokens: Vec<&str> = c["logprobs"]["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap())
                    .collect();
                assert!(tokens.len() >= keep, "{c}");
                *counts.entry(tokens[..keep].join("\u{1}")).or_default() += 1;
            }
        }
    }
    counts
}

/// Asserts that two samples of outcomes could come from one distribution (χ² homogeneity,
/// p > 0.01).
pub fn same_distribution(a: &HashMap<String, usize>, b: &HashMap<String, usize>) {
    // Homogeneity test over the outcomes seen at least 10 times in all; the rest pooled.
    let (na, nb) = (
        a.values().sum::<usize>() as f64,
        b.values().sum::<usize>() as f64,
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut other = (0.0, 0.0);
    for k in keys {
        let (x, y) = (
            *a.get(k).unwrap_or(&0) as f64,
            *b.get(k).unwrap_or(&0) as f64,
        );
        if x + y >= 10.0 {
            cells.push((x, y));
        } else {
            other.0 += x;
            other.1 += y;
        }
    }
    if other.0 + other.1 > 0.0 {
        cells.push(other);
    }
    assert!(cells.len() >= 3, "too few outcomes to test: {cells:?}");
    let total = na + nb;
    let stat: f64 = cells
        .iter()
        .map(|&(x, y)| {
            let col = x + y;
            let (ea, eb) = (col * na / total, col * nb / total);
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum();
    let p = chi2_upper_tail(stat, (cells.len() - 1) as f64);
    assert!(
        p > 0.01,
        "χ² = {stat:.1} over {} cells: p = {p:.4}",
        cells.len()
    );
}

/// ln Γ(x), Lanczos (g = 7, 9 terms).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let t = x + 7.5;
    let series: f64 = C[0] + (1..9).map(|i| C[i] / (x + i as f64)).sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// The chi-square upper tail, Q(df/2, x/2) (series or continued fraction, as usual).
fn chi2_upper_tail(x: f64, df: f64) -> f64 {
    let (a, x) = (df / 2.0, x / 2.0);
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..500 {
            n += 1.0;
            term *= x / n;
            sum += term;
        }
        1.0 - front * sum
    } else {
        let (mut b, mut c, mut d) = (x + 1.0 - a, 1e300, 1.0 / (x + 1.0 - a));
        let mut h = d;
        for i in 1..500 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = 1.0 / (an * d + b);
            c = b + an / c;
            h *= d * c;
        }
        front * h
    }
}

#[test]
fn the_chi_square_tail_is_right() {
    // Known values: P(χ²₁ > 3.841) = 0.05, P(χ²₁₀ > 18.307) = 0.05, P(χ²₄ > 1.0636) = 0.9.
    assert!((chi2_upper_tail(3.841, 1.0) - 0.05).abs() < 1e-3);
    assert!((chi2_upper_tail(18.307, 10.0) - 0.05).abs() < 1e-3);
    assert!((chi2_upper_tail(1.0636, 4.0) - 0.9).abs() < 1e-3);
}
