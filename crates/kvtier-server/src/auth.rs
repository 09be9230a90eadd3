//! Bearer-token authentication and namespace access control (docs/security.md).
//!
//! Tokens come from a TOML file (`--auth-tokens FILE`, reloaded on SIGHUP):
//!
//! ```toml
//! [[tokens]]
//! token = "s3cr3t-for-acme"          # what clients send: `authorization: Bearer s3cr3t-for-acme`
//! namespaces = ["acme/", "=kvstore:acme/c1"]  # see below
//! access = "read-write"              # or "read"
//! name = "acme inference fleet"      # optional, for logs
//! ```
//!
//! A grant is `""` (every namespace), a prefix that ends in a separator
//! (`"acme/"`, `"kvstore:"`), or one namespace exactly (`"=kvstore:acme/c1"`);
//! anything else (`"acme"`) is refused at load, naming both fixes, since a
//! bare prefix would also cover `acme2/...` ([`scope`]).
//!
//! Every API checks the same way: no or an unknown token → UNAUTHENTICATED
//! (HTTP 401); a namespace outside the token's grants, or a write with a
//! read-only token → PERMISSION_DENIED (HTTP 403). Tokens are kept as SHA-256
//! digests and compared by digest lookup, so the file's secrets are not held
//! in memory and a comparison does not leak a prefix through timing.
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

mod scope;
pub use scope::Scope;

/// What a token may do in its namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Lookup, Read, Stats, leases.
    Read,
    /// Also Write and Delete.
    ReadWrite,
}

/// One token's rights.
#[derive(Debug, Clone)]
pub struct Grant {
    /// For logs and metrics; never the token itself.
    pub name: String,
    /// The namespaces it covers.
    pub namespaces: Vec<Scope>,
    /// Read or read-write.
    pub access: Access,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No credentials, or unknown ones.
    Unauthenticated(String),
    /// Known credentials without the right.
    PermissionDenied(String),
}

impl Denied {
    /// The HTTP status code for this refusal.
    pub fn http(&self) -> u16 {
        match self {
            Denied::Unauthenticated(_) => 401,
            Denied::PermissionDenied(_) => 403,
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Denied::Unauthenticated(m) | Denied::PermissionDenied(m) => m,
        }
    }
}

/// Who is asking: everyone (authentication off) or one token's grant.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Authentication is off: everything is allowed.
    Anyone,
    /// An authenticated token.
    Token(Arc<Grant>),
}

impl Principal {
    /// May this principal read (`write = false`) or write `namespace`?
    pub fn check(&self, namespace: &str, write: bool) -> Result<(), Denied> {
        let Principal::Token(g) = self else {
            return Ok(());
        };
        if !g.namespaces.iter().any(|s| s.covers(namespace)) {
            return Err(Denied::PermissionDenied(format!(
                "token {:?} may not use namespace {:?}",
                g.name,
                truncate(namespace, 140)
            )));
        }
        if write && g.access == Access::Read {
            return Err(Denied::PermissionDenied(format!(
                "token {:?} is read-only",
                g.name
            )));
        }
        Ok(())
    }

    /// A short label for logs (never the token).
    pub fn label(&self) -> &str {
        match self {
            Principal::Anyone => "anyone",
            Principal::Token(g) => &g.name,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tokens: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token: String,
    namespaces: Vec<String>,
    access: String,
    #[serde(default)]
    name: Option<String>,
}

type Table = HashMap<[u8; 32], Arc<Grant>>;

/// The token table, swapped whole on reload.
pub struct Auth {
    path: Option<PathBuf>,
    table: RwLock<Arc<Table>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// Parses a tokens file's text into its table; errors name the entry.
fn parse(text: &str, origin: &str) -> anyhow::Result<Table> {
    let f: File =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: not a tokens file: {e}"))?;
    let mut table = Table::new();
    for (i, e) in f.tokens.into_iter().enumerate() {
        let what = |m: &str| anyhow::anyhow!("{origin}: tokens[{i}]: {m}");
        if e.token.len() < 16 {
            return Err(what("a token must be at least 16 characters"));
        }
        if e.token.trim() != e.token || e.token.chars().any(char::is_control) {
            return Err(what(
                "a token may not contain whitespace at its ends or control characters",
            ));
        }
        let access = match e.access.as_str() {
            "read" => Access::Read,
            "read-write" => Access::ReadWrite,
            other => {
                return Err(what(&format!(
                    "access must be \"read\" or \"read-write\", not {other:?}"
                )));
            }
        };
        if e.namespaces.is_empty() {
            return Err(what(
                "namespaces is empty: list grants (\"acme/\", \"=acme\"), or \"\" for every namespace",
            ));
        }
        let namespaces = e
            .namespaces
            .iter()
            .enumerate()
            .map(|(j, n)| Scope::parse(n).map_err(|m| what(&format!("namespaces[{j}]: {m}"))))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let grant = Grant {
            name: e.name.unwrap_or_else(|| format!("tokens[{i}]")),
            namespaces,
            access,
        };
        if table.insert(digest(&e.token), Arc::new(grant)).is_some() {
            return Err(what("the same token appears twice"));
        }
    }
    Ok(table)
}

impl Auth {
    /// Authentication off: every request is allowed.
    pub fn disabled() -> Self {
        Self {
            path: None,
            table: RwLock::new(Arc::new(Table::new())),
        }
    }

    /// Loads a tokens file.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let a = Self {
            path: Some(path.to_path_buf()),
            table: RwLock::new(Arc::new(Table::new())),
        };
        a.reload()?;
        Ok(a)
    }

    /// Tokens from text (tests, embedding).
    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        Ok(Self {
            path: None,
            table: RwLock::new(Arc::new(parse(text, "tokens")?)),
        })
    }

    /// Is authentication on?
    pub fn enabled(&self) -> bool {
        self.path.is_some() || !self.table.read().expect("auth lock").is_empty()
    }

    /// Reads the tokens file again; on error the old table stays. Returns
    /// the number of tokens now in force.
    pub fn reload(&self) -> anyhow::Result<usize> {
        let Some(path) = &self.path else {
            return Ok(self.table.read().expect("auth lock").len());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let table = parse(&text, &path.display().to_string())?;
        let n = table.len();
        *self.table.write().expect("auth lock") = Arc::new(table);
        Ok(n)
    }

    /// Who sends `authorization` (the header's whole value, `Bearer TOKEN`).
    pub fn identify(&self, authorization: Option<&str>) -> Result<Principal, Denied> {
        if !self.enabled() {
            return Ok(Principal::Anyone);
        }
        let Some(value) = authorization else {
            return Err(Denied::Unauthenticated(
                "this server requires a token: send `authorization: Bearer TOKEN`".into(),
            ));
        };
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| {
                Denied::Unauthenticated("the authorization value must be `Bearer TOKEN`".into())
            })?;
        self.identify_token(token)
    }

    /// Who holds `token` (data plane: the token itself, no scheme).
    pub fn identify_token(&self, token: &str) -> Result<Principal, Denied> {
        if !self.enabled() {
            return Ok(Principal::Anyone);
        }
        let table = self.table.read().expect("auth lock").clone();
        table
            .get(&digest(token.trim()))
            .map(|g| Principal::Token(g.clone()))
            .ok_or_else(|| Denied::Unauthenticated("unknown token".into()))
    }
}

impl From<Denied> for crate::refusal::Refusal {
    fn from(d: Denied) -> Self {
        use crate::refusal::{Kind, Refusal};
        match d {
            Denied::Unauthenticated(m) => Refusal::new(Kind::Unauthenticated, m),
            Denied::PermissionDenied(m) => Refusal::new(Kind::PermissionDenied, m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[tokens]]
token = "aaaaaaaaaaaaaaaaaaaa"
namespaces = ["acme/"]
access = "read-write"
name = "acme"

[[tokens]]
token = "rrrrrrrrrrrrrrrrrrrr"
namespaces = ["acme/", "shared/"]
access = "read"

[[tokens]]
token = "ssssssssssssssssssss"
namespaces = [""]
access = "read-write"
name = "admin"

[[tokens]]
token = "kkkkkkkkkkkkkkkkkkkk"
namespaces = ["=kvstore:acme/c1", "kvstore:beta/"]
access = "read-write"
name = "one container"
"#;

    #[test]
    fn tokens_grant_prefixes_and_access() {
        let a = Auth::from_toml(FILE).unwrap();
        assert!(a.enabled());
        let acme = a.identify(Some("Bearer aaaaaaaaaaaaaaaaaaaa")).unwrap();
        assert!(acme.check("acme/llama", true).is_ok());
        assert!(matches!(
            acme.check("other/llama", false),
            Err(Denied::PermissionDenied(_))
        ));
        let ro = a.identify(Some("Bearer rrrrrrrrrrrrrrrrrrrr")).unwrap();
        assert!(ro.check("shared/x", false).is_ok());
        assert_eq!(
            ro.check("shared/x", true),
            Err(Denied::PermissionDenied(
                "token \"tokens[1]\" is read-only".into()
            ))
        );
        let admin = a.identify_token("ssssssssssssssssssss").unwrap();
        assert!(admin.check("anything", true).is_ok());
        for bad in [
            None,
            Some("aaaaaaaaaaaaaaaaaaaa"),
            Some("Bearer nope-nope-nope-nope"),
        ] {
            assert!(
                matches!(a.identify(bad), Err(Denied::Unauthenticated(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn grants_are_exact_or_end_at_a_separator() {
        let a = Auth::from_toml(FILE).unwrap();
        let acme = a.identify_token("aaaaaaaaaaaaaaaaaaaa").unwrap();
        assert!(matches!(
            acme.check("acme2/x", false),
            Err(Denied::PermissionDenied(_))
        ));
        let one = a.identify_token("kkkkkkkkkkkkkkkkkkkk").unwrap();
        assert!(one.check("kvstore:acme/c1", true).is_ok());
        assert!(one.check("kvstore:beta/c10", true).is_ok());
        for other in ["kvstore:acme/c10", "kvstore:acme/c1/x", "kvstore:acme2/c1"] {
            assert_eq!(
                one.check(other, false),
                Err(Denied::PermissionDenied(format!(
                    "token \"one container\" may not use namespace {other:?}"
                ))),
            );
        }
    }

    #[test]
    fn disabled_allows_everything() {
        let a = Auth::disabled();
        assert!(!a.enabled());
        let p = a.identify(None).unwrap();
        assert!(p.check("any", true).is_ok());
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named() {
        for (text, want) in [
            (
                "[[tokens]]\ntoken = \"short\"\nnamespaces = [\"a/\"]\naccess = \"read\"",
                "at least 16",
            ),
            (
                "[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = [\"a/\"]\naccess = \"write\"",
                "access must be",
            ),
            (
                "[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = []\naccess = \"read\"",
                "namespaces is empty",
            ),
            (
                "[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = [\"a/\", \"kvstore:acme/c1\"]\naccess = \"read\"",
                "tokens[0]: namespaces[1]: \"kvstore:acme/c1\" is ambiguous",
            ),
            (
                "[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = [\"a/\"]\naccess = \"read\"\nbogus = 1",
                "not a tokens file",
            ),
            (
                "[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = [\"a/\"]\naccess = \"read\"\n[[tokens]]\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nnamespaces = [\"b/\"]\naccess = \"read\"",
                "twice",
            ),
        ] {
            let e = Auth::from_toml(text).err().expect(text).to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn reload_swaps_the_table_and_keeps_it_on_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        std::fs::write(&p, FILE).unwrap();
        let a = Auth::from_file(&p).unwrap();
        assert!(a.identify_token("aaaaaaaaaaaaaaaaaaaa").is_ok());
        std::fs::write(
            &p,
            "[[tokens]]\ntoken = \"bbbbbbbbbbbbbbbbbbbb\"\nnamespaces = [\"b/\"]\naccess = \"read\"",
        )
        .unwrap();
        assert_eq!(a.reload().unwrap(), 1);
        assert!(a.identify_token("aaaaaaaaaaaaaaaaaaaa").is_err(), "revoked");
        assert!(a.identify_token("bbbbbbbbbbbbbbbbbbbb").is_ok());
        std::fs::write(&p, "not toml [").unwrap();
        assert!(a.reload().is_err());
        assert!(
            a.identify_token("bbbbbbbbbbbbbbbbbbbb").is_ok(),
            "the old table stays"
        );
    }
}
