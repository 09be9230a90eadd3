//! The systems `kvtier bench` measures next to kvtier, in the same run and
//! with the same steps: Redis ([`redis`], through [`resp`] or the `redis`
//! crate) and Mooncake Store ([`mooncake`], through its own Python API).

pub mod mooncake;
pub mod redis;
pub mod resp;

/// One `--competitor`: what to compare kvtier with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompetitorSpec {
    /// A private `redis-server` started by the run.
    RedisSpawn,
    /// A running Redis, `redis://HOST:PORT`.
    Redis(String),
    /// A private Mooncake Store started by the run.
    MooncakeSpawn,
}

impl CompetitorSpec {
    /// Parses `redis://spawn`, `redis://HOST:PORT` or `mooncake://spawn`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "redis://spawn" => return Ok(CompetitorSpec::RedisSpawn),
            "mooncake://spawn" => return Ok(CompetitorSpec::MooncakeSpawn),
            _ => {}
        }
        let addr_ok = s.strip_prefix("redis://").is_some_and(|a| {
            a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        });
        anyhow::ensure!(
            addr_ok,
            "unsupported competitor {s:?}: expected redis://HOST:PORT, redis://spawn or mooncake://spawn"
        );
        Ok(CompetitorSpec::Redis(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::CompetitorSpec;

    #[test]
    fn peers_parse_or_say_what_is_expected() {
        assert_eq!(
            CompetitorSpec::parse("redis://spawn").unwrap(),
            CompetitorSpec::RedisSpawn
        );
        assert_eq!(
            CompetitorSpec::parse("redis://10.0.0.1:6379").unwrap(),
            CompetitorSpec::Redis("redis://10.0.0.1:6379".into())
        );
        assert_eq!(
            CompetitorSpec::parse("mooncake://spawn").unwrap(),
            CompetitorSpec::MooncakeSpawn
        );
        for bad in [
            "memcached://x",
            "redis://nohost",
            "redis://:1",
            "redis://h:99999",
        ] {
            let e = CompetitorSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected redis://HOST:PORT"), "{bad}: {e}");
        }
    }
}
