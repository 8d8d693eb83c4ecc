//! Who may read the UI. With tokens configured, a person signs in once with
//! a read token and gets a session cookie (HttpOnly, SameSite=Strict, and
//! Secure under TLS); scripts send `Authorization: Bearer` as the CLI does.
//!
//! Sessions live in this collector's memory and name the token they were
//! opened with, which is checked again on every request: a token removed
//! from the tokens file (and SIGHUP) ends its sessions at once. A
//! collector restart, or another replica behind a balancer, asks to sign
//! in again.
use std::{
    collections::HashMap,
    io::Read,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::auth::{Auth, Role};

pub const COOKIE: &str = "sqlbee_session";
/// A session ends this long after sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions held at once; signing in past this ends the oldest.
const MAX_SESSIONS: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot read random bytes for a session id from /dev/urandom: {source}")]
    Random {
        #[source]
        source: std::io::Error,
    },
}

/// Why a request may not read.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No token and no session: a page goes to the login page.
    SignIn,
    /// A token was presented and refused; the reason says why.
    Refused(String),
    /// This address had too many tokens refused: wait this long.
    Throttled(Duration),
}

struct Session {
    token: Vec<u8>,
    opened: Instant,
}

pub struct Sessions {
    auth: Auth,
    open: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    pub fn new(auth: Auth) -> Sessions {
        Sessions { auth, open: Mutex::new(HashMap::new()) }
    }

    /// Whether reading needs a token at all.
    pub fn required(&self) -> bool {
        self.auth.token_count() > 0
    }

    /// A token presented from `peer` (counted and throttled when refused);
    /// None: a session's own token, checked again.
    fn check_token(&self, token: &[u8], peer: Option<std::net::IpAddr>) -> Result<(), Refusal> {
        let mut header = b"Bearer ".to_vec();
        header.extend_from_slice(token);
        let checked = match peer {
            Some(_) => self.auth.check_from(Role::Read, Some(&header), peer, "http"),
            None => self.auth.check(Role::Read, Some(&header)),
        };
        checked.map(|_| ()).map_err(|status| Refusal::Refused(status.message().to_string()))
    }

    /// Signs in with a token from `peer`: the new session's id, or why not.
    pub fn sign_in(&self, token: &str, peer: std::net::IpAddr) -> Result<Result<String, Refusal>, SessionError> {
        let token = token.trim();
        if token.is_empty() {
            return Ok(Err(Refusal::Refused("no token given".into())));
        }
        if let Some(wait) = self.auth.refused_wait(peer) {
            return Ok(Err(Refusal::Throttled(wait)));
        }
        if let Err(refusal) = self.check_token(token.as_bytes(), Some(peer)) {
            return Ok(Err(refusal));
        }
        let id = random_id()?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, s| s.opened.elapsed() < LIFETIME);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open.iter().min_by_key(|(_, s)| s.opened).map(|(id, _)| id.clone())
        {
            open.remove(&oldest);
        }
        open.insert(id.clone(), Session { token: token.as_bytes().to_vec(), opened: Instant::now() });
        Ok(Ok(id))
    }

    pub fn sign_out(&self, cookie_header: Option<&str>) {
        if let Some(id) = cookie_header.and_then(session_id) {
            self.open.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        }
    }

    /// Whether a request may read: no tokens configured, a bearer token
    /// that reads, or a live session whose token still reads.
    pub fn admit(
        &self,
        authorization: Option<&str>,
        cookie_header: Option<&str>,
        peer: std::net::IpAddr,
    ) -> Result<(), Refusal> {
        if !self.required() {
            return Ok(());
        }
        if let Some(header) = authorization {
            if let Some(wait) = self.auth.refused_wait(peer) {
                return Err(Refusal::Throttled(wait));
            }
            let token = header
                .strip_prefix("Bearer ")
                .or_else(|| header.strip_prefix("bearer "))
                .ok_or_else(|| Refusal::Refused("authorization is not of the form `Bearer <token>`".into()))?;
            return self.check_token(token.as_bytes(), Some(peer));
        }
        let Some(id) = cookie_header.and_then(session_id) else { return Err(Refusal::SignIn) };
        let token = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get(id) {
                Some(s) if s.opened.elapsed() < LIFETIME => s.token.clone(),
                Some(_) => {
                    open.remove(id);
                    return Err(Refusal::SignIn);
                }
                None => return Err(Refusal::SignIn),
            }
        };
        if self.check_token(&token, None).is_err() {
            // The token left the tokens file: its sessions end with it.
            self.open.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
            return Err(Refusal::SignIn);
        }
        Ok(())
    }
}

/// The session id in a Cookie header, if any.
fn session_id(header: &str) -> Option<&str> {
    header.split(';').filter_map(|pair| pair.trim().split_once('=')).find(|(name, _)| *name == COOKIE).map(|(_, v)| v)
}

/// 32 random bytes as hex: unguessable, and safe in a cookie.
fn random_id() -> Result<String, SessionError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| SessionError::Random { source })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The Set-Cookie value that opens a session.
pub fn open_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        LIFETIME.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The Set-Cookie value that ends one.
pub fn close_cookie(secure: bool) -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}", if secure { "; Secure" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn sessions(tokens: &str) -> (Sessions, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("sqlbee-session-{}-{}", std::process::id(), tokens.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, tokens).unwrap();
        (Sessions::new(Auth::from_file(&path).unwrap()), path)
    }

    #[test]
    fn a_read_token_opens_a_session_and_others_do_not() {
        let (s, path) = sessions(
            "read reader-token-0123456789abcdef0123456789abcdef\ningest agent-token-0123456789abcdef0123456789abcdef\n",
        );
        assert_eq!(s.admit(None, None, PEER), Err(Refusal::SignIn));
        assert!(matches!(s.sign_in("wrong", PEER).unwrap(), Err(Refusal::Refused(_))));
        assert!(
            matches!(s.sign_in("agent-token-0123456789abcdef0123456789abcdef", PEER).unwrap(), Err(Refusal::Refused(m)) if m.contains("not read"))
        );
        let id = s.sign_in("reader-token-0123456789abcdef0123456789abcdef", PEER).unwrap().unwrap();
        assert_eq!(id.len(), 64);
        let cookie = format!("other=1; {COOKIE}={id}");
        assert_eq!(s.admit(None, Some(&cookie), PEER), Ok(()));
        assert_eq!(s.admit(None, Some(&format!("{COOKIE}=forged")), PEER), Err(Refusal::SignIn));
        assert_eq!(s.admit(Some("Bearer reader-token-0123456789abcdef0123456789abcdef"), None, PEER), Ok(()));
        assert!(matches!(
            s.admit(Some("Bearer agent-token-0123456789abcdef0123456789abcdef"), None, PEER),
            Err(Refusal::Refused(_))
        ));
        // Removing the token ends its sessions.
        std::fs::write(&path, "read another-token-0123456789abcdef0123456789abcdef\n").unwrap();
        s.auth.reload().unwrap();
        assert_eq!(s.admit(None, Some(&cookie), PEER), Err(Refusal::SignIn));
        s.sign_out(Some(&cookie));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn cookies_say_how_they_may_travel() {
        assert!(open_cookie("ab", true).contains("HttpOnly; SameSite=Strict; Max-Age=43200; Secure"));
        assert!(!open_cookie("ab", false).contains("Secure"));
        assert!(close_cookie(false).contains("Max-Age=0"));
    }
}
