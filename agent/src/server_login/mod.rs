//! The optional login to the traced servers (`--server-login FILE`): a
//! TOML file with `user` and either `password` or `password_file`, and
//! where to reach each server (`address`). Counting never needs it; the
//! rooms that add with it (connect attributes in `discover` and `probe`,
//! `plans`, the blockers in `activity`) all take it from here, below them.
//!
//! A file that holds a password must be the agent's alone: owned by the
//! user the agent runs as and readable by nobody else (mode 0600 or
//! 0400). Anything looser is refused at start, with the reason, rather
//! than trusted.
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

mod address;

pub use address::{ServerAddress, address_of};

use crate::normalize::redact;

/// An error the server or the socket gave, redacted (messages quote values).
pub fn describe(error: &mysql::Error) -> String {
    match error {
        mysql::Error::MySqlError(e) => format!("{} ({})", redact::message(&e.message), e.code),
        other => redact::message(&other.to_string()),
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct ServerLogin {
    pub user: String,
    pub password: String,
}

/// The password never reaches a log line.
impl std::fmt::Debug for ServerLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerLogin").field("user", &self.user).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("server login {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "server login {path}: mode {mode:04o} lets others read or change it; it holds a password, so it must be \
         0600 or 0400 (chmod 600 {path})"
    )]
    Mode { path: PathBuf, mode: u32 },
    #[error(
        "server login {path}: owned by uid {owner}, but the agent runs as uid {agent}; chown it to the agent's user"
    )]
    Owner { path: PathBuf, owner: u32, agent: u32 },
    #[error("server login {path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginFile {
    user: String,
    password: Option<String>,
    password_file: Option<PathBuf>,
}

impl ServerLogin {
    /// Logs in to the server with this pid over the socket or loopback
    /// port it listens on, every wait bounded by `timeout`. The error says
    /// what failed, redacted (the server's messages quote values).
    pub fn connect(&self, pid: u32, timeout: Duration) -> Result<(mysql::Conn, ServerAddress), String> {
        let address = address_of(pid)
            .ok_or_else(|| format!("server pid {pid} listens on no socket or TCP port the agent can see"))?;
        let opts = mysql::OptsBuilder::new()
            .user(Some(&self.user))
            .pass(Some(&self.password))
            .prefer_socket(false)
            .stmt_cache_size(0)
            .tcp_connect_timeout(Some(timeout))
            .read_timeout(Some(timeout))
            .write_timeout(Some(timeout))
            .connect_attrs(Some(HashMap::from([("program_name", "sqlbee")])));
        let opts = match &address {
            ServerAddress::Socket(path) => opts.socket(Some(path.to_string_lossy())),
            ServerAddress::Tcp(port) => opts.ip_or_hostname(Some("127.0.0.1")).tcp_port(*port),
        };
        let conn = mysql::Conn::new(opts)
            .map_err(|e| format!("login as {} over {address} failed: {}", self.user, describe(&e)))?;
        Ok((conn, address))
    }

    /// Reads and checks the file at `path` (and the password file it names).
    pub fn load(path: &Path) -> Result<ServerLogin, LoginError> {
        let text = read_private(path)?;
        let invalid = |detail: String| LoginError::Invalid { path: path.into(), detail };
        let file: LoginFile = toml::from_str(&text).map_err(|e| invalid(e.message().to_string()))?;
        if file.user.is_empty() {
            return Err(invalid("`user` is empty".into()));
        }
        let password = match (file.password, file.password_file) {
            (Some(password), None) => password,
            (None, Some(other)) => {
                let other =
                    if other.is_relative() { path.parent().unwrap_or(Path::new("")).join(other) } else { other };
                read_private(&other)?.trim_end_matches(['\n', '\r']).to_string()
            }
            (Some(_), Some(_)) => return Err(invalid("give `password` or `password_file`, not both".into())),
            (None, None) => return Err(invalid("`password` or `password_file` is missing".into())),
        };
        Ok(ServerLogin { user: file.user, password })
    }
}

/// The file's text, if it is the agent's alone.
fn read_private(path: &Path) -> Result<String, LoginError> {
    let read = |source| LoginError::Read { path: path.into(), source };
    let meta = std::fs::metadata(path).map_err(read)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 || mode & 0o100 != 0 {
        return Err(LoginError::Mode { path: path.into(), mode });
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let agent = unsafe { libc::geteuid() };
    if meta.uid() != agent {
        return Err(LoginError::Owner { path: path.into(), owner: meta.uid(), agent });
    }
    std::fs::read_to_string(path).map_err(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn private_files_load_and_loose_ones_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("sqlbee-login-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inline = write(&dir, "inline.toml", "user = \"sqlbee\"\npassword = \"pw\"\n", 0o600);
        let login = ServerLogin::load(&inline).unwrap();
        assert_eq!((login.user.as_str(), login.password.as_str()), ("sqlbee", "pw"));
        assert!(!format!("{login:?}").contains("pw\""), "the password stays out of Debug");

        write(&dir, "secret", "from-file\n", 0o400);
        let by_file = write(&dir, "by-file.toml", "user = \"sqlbee\"\npassword_file = \"secret\"\n", 0o400);
        assert_eq!(ServerLogin::load(&by_file).unwrap().password, "from-file");

        let loose = write(&dir, "loose.toml", "user = \"sqlbee\"\npassword = \"pw\"\n", 0o644);
        let message = ServerLogin::load(&loose).unwrap_err().to_string();
        assert!(message.contains("0644") && message.contains("chmod 600"), "{message}");

        write(&dir, "loose-secret", "pw\n", 0o640);
        let via_loose = write(&dir, "via-loose.toml", "user = \"u\"\npassword_file = \"loose-secret\"\n", 0o600);
        assert!(matches!(ServerLogin::load(&via_loose), Err(LoginError::Mode { .. })));

        let both = write(&dir, "both.toml", "user = \"u\"\npassword = \"a\"\npassword_file = \"secret\"\n", 0o600);
        assert!(ServerLogin::load(&both).unwrap_err().to_string().contains("not both"));
        let typo = write(&dir, "typo.toml", "user = \"u\"\npasword = \"a\"\n", 0o600);
        assert!(ServerLogin::load(&typo).unwrap_err().to_string().contains("pasword"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
