//! Latencies of a run of calls, as the benchmarks report them.

use std::time::Duration;

/// Latencies of a run, and its wall time.
pub struct Sample {
    pub latencies: Vec<Duration>,
    pub wall: Duration,
}

impl Sample {
    pub fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted
            .get(index)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or_default()
    }

    fn mean(&self) -> f64 {
        let total: f64 = self.latencies.iter().map(Duration::as_secs_f64).sum();
        total * 1000.0 / self.latencies.len().max(1) as f64
    }

    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    pub fn row(&self, name: &str) -> String {
        format!(
            "{name:<44} {:>9.3} {:>9.3} {:>9.3} {:>11.1}",
            self.percentile(0.5),
            self.percentile(0.99),
            self.mean(),
            self.rate()
        )
    }
}
