//! `toolgrid bench calls --stages`: where a call's time goes, stage by stage, from the
//! platform's `toolgrid_call_stage_seconds` histograms read before and after a run (the
//! difference is the run's calls alone).

use anyhow::Context;
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolgrid_control_plane::metrics::Stage;

/// One stage's histogram: cumulative counts by upper bound (seconds), its sum and count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// What was added between `before` and `self`.
    pub fn since(&self, before: &Histogram) -> Histogram {
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0, |(_, n)| *n)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n.saturating_sub(earlier(*le))))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count.saturating_sub(before.count),
        }
    }

    /// The `q` quantile in milliseconds, interpolated within its bucket.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q * self.count as f64;
        let mut lower = (0.0, 0u64);
        for &(le, cumulative) in &self.buckets {
            if cumulative as f64 >= rank {
                if le.is_infinite() {
                    return Some(lower.0 * 1e3);
                }
                let within = cumulative - lower.1;
                let share = if within == 0 {
                    1.0
                } else {
                    (rank - lower.1 as f64) / within as f64
                };
                return Some((lower.0 + (le - lower.0) * share) * 1e3);
            }
            lower = (le, cumulative);
        }
        None
    }

    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64 * 1e3)
    }
}

fn label<'l>(labels: &'l str, name: &str) -> Option<&'l str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let end = labels[start..].find('"')? + start;
    Some(&labels[start..end])
}

/// The stage histograms in a Prometheus text exposition.
pub fn parse(text: &str) -> BTreeMap<String, Histogram> {
    let mut out: BTreeMap<String, Histogram> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("toolgrid_call_stage_seconds_") else {
            continue;
        };
        let Some((series, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let (kind, labels) = series.split_once('{').unwrap_or((series, ""));
        let Some(stage) = label(labels, "stage") else {
            continue;
        };
        let entry = out.entry(stage.to_string()).or_default();
        match kind {
            "bucket" => {
                let le = label(labels, "le").and_then(|le| {
                    if le == "+Inf" {
                        Some(f64::INFINITY)
                    } else {
                        le.parse().ok()
                    }
                });
                if let (Some(le), Ok(n)) = (le, value.parse::<u64>()) {
                    entry.buckets.push((le, n));
                }
            }
            "sum" => entry.sum = value.parse().unwrap_or(0.0),
            "count" => entry.count = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    for histogram in out.values_mut() {
        histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The value of the counter `name` (its full name, `_total` and all) in a `/metrics` text.
pub fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (metric, value) = line.split_once(' ')?;
        (metric == name).then(|| value.trim().parse().ok())?
    })
}

/// `GET /metrics` of the platform at `http` (`host:port`, plaintext), as an operator: its
/// text.
pub async fn scrape(http: &str, token: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(http)
        .await
        .with_context(|| format!("cannot reach {http}"))?;
    stream
        .write_all(
            format!(
                "GET /metrics HTTP/1.1\r\nHost: {http}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no HTTP answer from /metrics")?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "/metrics answered {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_string())
}

/// One stage's row: its name, p50, p99 and mean in milliseconds (`None`: no call), and
/// how many calls passed it.
pub struct Row {
    pub stage: &'static str,
    /// The stage runs beside others ([`Stage::runs_beside`]): no part of their sum.
    pub beside: bool,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
    pub count: u64,
}

/// The table of where the calls between `before` and `after` spent their time.
pub fn table(
    before: &BTreeMap<String, Histogram>,
    after: &BTreeMap<String, Histogram>,
) -> Vec<Row> {
    Stage::ALL
        .iter()
        .map(|&kind| {
            let stage = kind.as_str();
            let empty = Histogram::default();
            let run = after
                .get(stage)
                .unwrap_or(&empty)
                .since(before.get(stage).unwrap_or(&empty));
            Row {
                stage,
                beside: kind.runs_beside(),
                p50: run.quantile_ms(0.5),
                p99: run.quantile_ms(0.99),
                mean: run.mean_ms(),
                count: run.count,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP toolgrid_call_stage_seconds x\n\
        toolgrid_call_stage_seconds_sum{stage=\"admit\"} 0.004\n\
        toolgrid_call_stage_seconds_count{stage=\"admit\"} 4\n\
        toolgrid_call_stage_seconds_bucket{le=\"0.001\",stage=\"admit\"} 2\n\
        toolgrid_call_stage_seconds_bucket{le=\"0.002\",stage=\"admit\"} 4\n\
        toolgrid_call_stage_seconds_bucket{le=\"+Inf\",stage=\"admit\"} 4\n\
        toolgrid_calls_total{tool=\"x\"} 9\n";

    #[test]
    fn stage_histograms_are_read_and_their_quantiles_interpolated() {
        let parsed = parse(TEXT);
        let admit = &parsed["admit"];
        assert_eq!(admit.count, 4);
        assert_eq!(admit.buckets.len(), 3);
        assert!((admit.quantile_ms(0.5).unwrap() - 1.0).abs() < 1e-9);
        assert!((admit.quantile_ms(0.75).unwrap() - 1.5).abs() < 1e-9);
        assert!((admit.mean_ms().unwrap() - 1.0).abs() < 1e-9);
        let none = admit.since(admit);
        assert_eq!((none.count, none.quantile_ms(0.5)), (0, None));
        let rows = table(&BTreeMap::new(), &parsed);
        assert_eq!(rows.len(), Stage::ALL.len());
        assert_eq!((rows[1].stage, rows[1].count), ("admit", 4));
    }

    #[test]
    fn a_counter_is_read_by_its_whole_name() {
        let text = "# TYPE toolgrid_store_syncs counter\n\
            toolgrid_store_syncs_total_x 5\n\
            toolgrid_store_syncs_total 12\n\
            toolgrid_store_commits_total 30\n";
        assert_eq!(counter(text, "toolgrid_store_syncs_total"), Some(12));
        assert_eq!(counter(text, "toolgrid_store_commits_total"), Some(30));
        assert_eq!(counter(text, "toolgrid_store_syncs"), None);
        assert_eq!(counter(TEXT, "toolgrid_calls_total"), None);
    }
}
