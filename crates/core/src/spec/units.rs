//! Sizes and durations as users write them in manifests.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A size in bytes, written as an integer or a Kubernetes quantity (`64Mi`, `1G`, `512k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// Why a size did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid size {input:?}: {why} (use bytes or a quantity such as 64Mi, 1Gi, 500k)")]
pub struct ParseSizeError {
    input: String,
    why: &'static str,
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseSizeError {
            input: s.to_string(),
            why,
        };
        let trimmed = s.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, suffix) = trimmed.split_at(split);
        if number.is_empty() {
            return Err(err("no number"));
        }
        let multiplier: u64 = match suffix {
            "" => 1,
            "k" | "K" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            _ => return Err(err("unknown unit")),
        };
        let value: f64 = number.parse().map_err(|_| err("not a number"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(err("out of range"));
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("Ti", 1 << 40),
            ("Gi", 1 << 30),
            ("Mi", 1 << 20),
            ("Ki", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes or a quantity such as 64Mi")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        super::schema::int_or_string(generator)
    }
}

/// A duration written in Go's format (`30s`, `1h30m`, `200ms`), as Kubernetes APIs do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match parse_go_duration(s) {
            Ok((_, true)) => Err(format!("invalid duration {s:?}: must not be negative")),
            Ok((duration, false)) => Ok(GoDuration(duration)),
            Err(why) => Err(format!(
                "invalid duration {s:?}: {why} (use e.g. 30s, 5m, 1h30m, 200ms)"
            )),
        }
    }
}

/// Parses Go's `time.ParseDuration` format: a sign, then one or more decimal numbers each
/// with a unit (`ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`); a lone `0` needs none. Answers
/// the magnitude and whether it was negative. The same grammar as Go's (and
/// `kube::core::Duration`'s), except that a duration too large to hold is refused rather
/// than a panic.
fn parse_go_duration(mut s: &str) -> Result<(Duration, bool), String> {
    const UNITS: &str = "expected one of 'ns', 'us', '\u{00b5}s', 'ms', 's', 'm', or 'h'";
    let negative = s.starts_with('-');
    s = s.trim_start_matches('+').trim_start_matches('-');
    let mut total = Duration::ZERO;
    while !s.is_empty() && s != "0" {
        let Some(unit_start) = s.find(|c: char| c.is_alphabetic()) else {
            return Err(format!("missing a unit: {UNITS}"));
        };
        let (value, rest) = s.split_at(unit_start);
        let value: f64 = value
            .parse()
            .map_err(|e| format!("invalid floating-point number: {e}"))?;
        let unit_end = rest
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        s = rest;
        let base = match unit {
            "ns" => Duration::from_nanos(1),
            // U+00B5 is the micro sign, U+03BC the Greek letter mu.
            "us" | "\u{00b5}s" | "\u{03bc}s" => Duration::from_micros(1),
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(format!("invalid unit: {UNITS}")),
        };
        // `Duration::mul_f64`, without its panic on overflow.
        let part = Duration::try_from_secs_f64(base.as_secs_f64() * value)
            .map_err(|_| "out of range".to_string())?;
        total = total
            .checked_add(part)
            .ok_or_else(|| "out of range".to_string())?;
    }
    Ok((total, negative))
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        let ms = d.as_millis();
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return write!(f, "{}ns", d.as_nanos());
        }
        if !ms.is_multiple_of(1000) {
            return write!(f, "{ms}ms");
        }
        let mut secs = d.as_secs();
        let mut out = String::new();
        if secs >= 3600 {
            out += &format!("{}h", secs / 3600);
            secs %= 3600;
        }
        if secs >= 60 {
            out += &format!("{}m", secs / 60);
            secs %= 60;
        }
        if secs > 0 {
            out += &format!("{secs}s");
        }
        f.write_str(&out)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl schemars::JsonSchema for GoDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GoDuration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        super::schema::duration(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_kubernetes_quantities() {
        assert_eq!("64Mi".parse::<ByteSize>().unwrap().bytes(), 64 << 20);
        assert_eq!("1Gi".parse::<ByteSize>().unwrap().bytes(), 1 << 30);
        assert_eq!("500k".parse::<ByteSize>().unwrap().bytes(), 500_000);
        assert_eq!("1.5Ki".parse::<ByteSize>().unwrap().bytes(), 1536);
        assert_eq!("4096".parse::<ByteSize>().unwrap().bytes(), 4096);
        assert!("64MB".parse::<ByteSize>().is_err());
        assert!("Mi".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64Mi");
        let from_int: ByteSize = serde_json::from_value(serde_json::json!(1024)).unwrap();
        assert_eq!(from_int, ByteSize(1024));
        assert!(serde_json::from_value::<ByteSize>(serde_json::json!(-1)).is_err());
    }

    #[test]
    fn durations_parse_in_go_format() {
        let d: GoDuration = "1h30m".parse().unwrap();
        assert_eq!(d.get(), Duration::from_secs(5400));
        assert_eq!(d.to_string(), "1h30m");
        assert_eq!(
            "200ms".parse::<GoDuration>().unwrap().get(),
            Duration::from_millis(200)
        );
        assert!("10".parse::<GoDuration>().is_err());
        assert!("-5s".parse::<GoDuration>().is_err());
        assert!("-0".parse::<GoDuration>().is_err());
        // Go's grammar: decimals, several units, a lone zero.
        assert_eq!(
            "1.5s".parse::<GoDuration>().unwrap().get(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            ".5s".parse::<GoDuration>().unwrap().get(),
            Duration::from_millis(500)
        );
        assert_eq!(
            "1h2m3s4ms5us6ns".parse::<GoDuration>().unwrap().get(),
            Duration::new(3723, 4_005_006)
        );
        assert_eq!("0".parse::<GoDuration>().unwrap().get(), Duration::ZERO);
        assert!("5x".parse::<GoDuration>().is_err());
        assert!("s".parse::<GoDuration>().is_err());
        // Too large to hold is an error, never a panic.
        assert!("99999999999999999999999h".parse::<GoDuration>().is_err());
    }
}
