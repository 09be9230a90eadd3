//! Byte sizes with units, for configuration (`2GiB`, `1.2MB`, `512KiB`, `4096`).
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::{fmt, str::FromStr};

/// A number of bytes, parsed from and printed as a human-readable size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n << 20)
    }
    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        Self(n << 30)
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num
            .parse()
            .map_err(|_| format!("invalid size {s:?}: expected e.g. 512MiB, 2GiB, 1.2MB"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "m" | "mb" => 1_000_000,
            "g" | "gb" => 1_000_000_000,
            "t" | "tb" => 1_000_000_000_000,
            "ki" | "kib" => 1 << 10,
            "mi" | "mib" => 1 << 20,
            "gi" | "gib" => 1 << 30,
            "ti" | "tib" => 1 << 40,
            other => return Err(format!("invalid size unit {other:?} in {s:?}")),
        };
        let v = num * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(format!("size {s:?} out of range"));
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if b >= 1 << shift && b & ((1 << shift) - 1) == 0 {
                return write!(f, "{}{unit}", b >> shift);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            N(u64),
            S(String),
        }
        match Repr::deserialize(d)? {
            Repr::N(n) => Ok(ByteSize(n)),
            Repr::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_units() {
        assert_eq!("2GiB".parse::<ByteSize>().unwrap(), ByteSize(2 << 30));
        assert_eq!("1.2MB".parse::<ByteSize>().unwrap(), ByteSize(1_200_000));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("64 MiB".parse::<ByteSize>().unwrap(), ByteSize(64 << 20));
        assert!("12XB".parse::<ByteSize>().is_err());
        assert!("abc".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }
}
