//! Whose socket a same-host client talks to (docs/security.md, "Threats and
//! their guards"). A client sends its bearer token to whatever process
//! listens on `unix://PATH`; a process that bound the path first (a stale
//! directory, a world-writable one) would collect it. So every Unix
//! connection is checked before its first byte: the listener's `SO_PEERCRED`
//! uid must be this process's effective uid, root, or the uid the client was
//! told to expect (`ClientConfig::server_uid`, `$KVTIER_SERVER_UID`).
use crate::{ClientError, Result};

/// The environment variable naming the uid a same-host server runs as.
pub const SERVER_UID_ENV: &str = "KVTIER_SERVER_UID";

/// The same-host socket's path, when `endpoint` is `unix://PATH` (or `unix:PATH`).
pub fn local_path(endpoint: &str) -> Option<&str> {
    endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
}

/// The uid the server may run as besides this process's and root's:
/// `configured`, else `$KVTIER_SERVER_UID` (a value that is not a number is
/// an error, not ignored).
pub fn expected_uid(configured: Option<u32>) -> Result<Option<u32>> {
    if configured.is_some() {
        return Ok(configured);
    }
    match std::env::var(SERVER_UID_ENV) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map(Some).map_err(|_| {
            ClientError::Invalid(format!(
                "{SERVER_UID_ENV}={v:?}: expected the numeric uid the kvtier server runs as"
            ))
        }),
        _ => Ok(None),
    }
}

/// Checks that the process listening at the other end of `sock` (connected
/// to `path`) runs as this process's effective uid, root or `server_uid`.
pub fn check(sock: &tokio::net::UnixStream, path: &str, server_uid: Option<u32>) -> Result<()> {
    let cred = sock.peer_cred().map_err(|e| ClientError::Unreachable {
        addr: format!("unix://{path}"),
        reason: format!("the listener's credentials: {e}"),
    })?;
    let uid = cred.uid();
    if uid == 0 || uid == nix::unistd::geteuid().as_raw() || Some(uid) == server_uid {
        return Ok(());
    }
    Err(ClientError::Invalid(format!(
        "unix://{path}: the process listening on this socket runs as uid {uid}, not as this \
         process's uid, root or the expected server uid ({}); refusing to send it anything, \
         the token included. Set ClientConfig::server_uid / {SERVER_UID_ENV} if kvtier runs \
         as uid {uid} (docs/security.md)",
        server_uid.map_or_else(|| "none set".to_string(), |u| u.to_string()),
    )))
}
