//! `[tenants]`: how the memory and disk tiers divide their capacity between
//! tenants, so that one tenant's writes cannot evict everyone else's blocks
//! (docs/security.md, "Capacity shares"; the policy is `kvtier_core::shares`).
use serde::{Deserialize, Serialize};

/// `[tenants]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsSection {
    /// Evict from the tenant most over its share (max-min fair over resident
    /// bytes); false = one tier-wide LRU, where any tenant can evict all others.
    pub fair_shares: bool,
    /// Weight of a tenant no share names (each namespace prefix up to its
    /// first `/` is one such tenant).
    pub default_weight: u32,
    /// Configured shares: `[[tenants.shares]] name, prefix, weight`.
    pub shares: Vec<ShareEntry>,
}

impl Default for TenantsSection {
    fn default() -> Self {
        let s = kvtier_core::Shares::default();
        Self {
            fair_shares: s.fair,
            default_weight: s.default_weight,
            shares: Vec::new(),
        }
    }
}

/// One `[[tenants.shares]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShareEntry {
    /// Metric label (`kvtier_share_*{share="name"}`).
    pub name: String,
    /// The namespaces starting with it are one tenant (the longest prefix wins).
    pub prefix: String,
    /// Relative weight, at least 1.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

impl TenantsSection {
    /// The engine's view of this section.
    pub fn shares(&self) -> kvtier_core::Shares {
        kvtier_core::Shares {
            fair: self.fair_shares,
            default_weight: self.default_weight,
            classes: self
                .shares
                .iter()
                .map(|s| kvtier_core::ShareClass {
                    name: s.name.clone(),
                    prefix: s.prefix.clone(),
                    weight: s.weight,
                })
                .collect(),
        }
    }

    /// Weights at least 1, names and prefixes unique.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.shares()
            .validate()
            .map_err(|e| anyhow::anyhow!("tenants: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    #[test]
    fn shares_parse_and_reach_the_engine_view() {
        let c = Config::parse(
            "[tenants]\ndefault_weight = 2\n[[tenants.shares]]\nname = \"acme\"\n\
             prefix = \"acme/\"\nweight = 3\n[[tenants.shares]]\nname = \"b\"\nprefix = \"b/\"\n",
        )
        .unwrap();
        let s = c.tenants.shares();
        assert!(s.fair);
        assert_eq!(s.default_weight, 2);
        assert_eq!((s.classes[0].weight, s.classes[1].weight), (3, 1));
        assert!(
            !Config::parse("[tenants]\nfair_shares = false\n")
                .unwrap()
                .tenants
                .fair_shares
        );
    }

    #[test]
    fn bad_shares_are_refused_with_their_name() {
        for (bad, what) in [
            (
                "[[tenants.shares]]\nname = \"a\"\nprefix = \"a/\"\nweight = 0\n",
                "weight",
            ),
            ("[tenants]\ndefault_weight = 0\n", "default_weight"),
            (
                "[[tenants.shares]]\nname = \"other\"\nprefix = \"a/\"\n",
                "reserved",
            ),
            (
                "[[tenants.shares]]\nname = \"a\"\nprefix = \"x/\"\n\
                 [[tenants.shares]]\nname = \"b\"\nprefix = \"x/\"\n",
                "same name or prefix",
            ),
        ] {
            let e = Config::parse(bad).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }
}
