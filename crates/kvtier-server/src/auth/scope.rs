//! What one entry of a token's `namespaces` covers (docs/security.md,
//! "Grants"). Matching by bare prefix let a grant for `kvstore:acme/c1`
//! reach container `c10`, and `acme` reach `acme2/...`; so a grant is now
//! one of three unambiguous forms, and anything else is refused at load
//! with the fix named:
//!
//! - `""`: every namespace;
//! - `"acme/"` (ends in a separator, `/` or `:`): every namespace that
//!   starts with it, so the prefix always ends at a separator (`"kvstore:"`
//!   is every kvstore tenant, `"kvstore:acme/"` every container of `acme`);
//! - `"=kvstore:acme/c1"` (starts with `=`): that one namespace, exactly.

/// One grant: every namespace, those under a prefix, or exactly one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `""`: every namespace.
    Every,
    /// `"acme/"`: namespaces that start with this, which ends in `/` or `:`.
    Under(String),
    /// `"=acme"`: this namespace and no other.
    Exactly(String),
}

impl Scope {
    /// Reads one entry of `namespaces`; the error says what to write instead.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Ok(Scope::Every);
        }
        if let Some(exact) = s.strip_prefix('=') {
            if exact.is_empty() {
                return Err(
                    "\"=\" names no namespace: write \"=NAMESPACE\" for one namespace, \
                     or \"\" for every namespace"
                        .into(),
                );
            }
            return Ok(Scope::Exactly(exact.to_string()));
        }
        if s.ends_with(['/', ':']) {
            return Ok(Scope::Under(s.to_string()));
        }
        Err(format!(
            "{s:?} is ambiguous (a bare prefix would also cover {:?}): write \"{s}/\" for the \
             namespaces under {s}/, or \"={s}\" for the namespace {s:?} alone (docs/security.md)",
            format!("{s}2")
        ))
    }

    /// Does this grant cover `namespace`?
    pub fn covers(&self, namespace: &str) -> bool {
        match self {
            Scope::Every => true,
            Scope::Under(prefix) => namespace.starts_with(prefix.as_str()),
            Scope::Exactly(ns) => namespace == ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(grant: &str, ns: &str) -> bool {
        Scope::parse(grant).unwrap().covers(ns)
    }

    #[test]
    fn an_exact_kvstore_grant_covers_its_container_only() {
        assert!(covers("=kvstore:acme/c1", "kvstore:acme/c1"));
        for other in [
            "kvstore:acme/c10",
            "kvstore:acme/c1/x",
            "kvstore:acme/c",
            "kvstore:acme/",
            "kvstore:acme2/c1",
        ] {
            assert!(!covers("=kvstore:acme/c1", other), "{other}");
        }
    }

    #[test]
    fn a_prefix_ends_at_a_separator() {
        assert!(covers("acme/", "acme/llama"));
        assert!(covers("acme/", "acme/"));
        assert!(!covers("acme/", "acme2/x"));
        assert!(!covers("acme/", "acme"));
        assert!(covers("kvstore:acme/", "kvstore:acme/c10"));
        assert!(!covers("kvstore:acme/", "kvstore:acme2/c1"));
        assert!(covers("kvstore:", "kvstore:acme/c1"));
        assert!(!covers("kvstore:", "kvstore2:acme/c1"));
    }

    #[test]
    fn the_empty_grant_covers_every_namespace() {
        for ns in ["a", "acme/x", "kvstore:acme/c1", ""] {
            assert!(covers("", ns), "{ns}");
        }
    }

    #[test]
    fn an_exact_grant_of_a_prefix_shaped_name_is_still_exact() {
        assert!(covers("=acme/", "acme/"));
        assert!(!covers("=acme/", "acme/x"));
        assert!(covers("=acme", "acme"));
        assert!(!covers("=acme", "acme2/x"));
        assert!(!covers("=acme", "acme/x"));
    }

    #[test]
    fn ambiguous_grants_are_refused_with_both_fixes_named() {
        for bad in ["acme", "kvstore:acme/c1", "kvstore"] {
            let e = Scope::parse(bad).unwrap_err();
            assert!(e.contains("ambiguous"), "{e}");
            assert!(e.contains(&format!("\"{bad}/\"")), "{e}");
            assert!(e.contains(&format!("\"={bad}\"")), "{e}");
        }
        assert!(
            Scope::parse("=")
                .unwrap_err()
                .contains("names no namespace")
        );
    }
}
