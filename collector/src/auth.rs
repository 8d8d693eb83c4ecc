//! Bearer-token check for the Ingest and Query services (not for health,
//! which load balancers probe without credentials). Runs before the
//! request body is read, so a refused caller costs no decoding.
//!
//! Tokens come from a file, one per line, reloaded on SIGHUP; without a
//! file every caller is let in. A token is for ingest, for reading, or
//! both, so that a database host's token cannot read the fleet; or for
//! writing markers only (`annotate`), so that a CI job can mark deploys
//! without reading or sending anything:
//!
//! ```text
//! # role   token        [agents=ID,ID] [instances=NAME,NAME]
//! ingest   3f9a0c...    agents=web-1,web-2
//! ingest   5d0e4a...    agents=db-7 instances=db-7:3306,db-7:3307
//! read     77c1b2...
//! annotate 9e41d7...
//! 77c1b2...                              a token alone: both, as before
//! ```
//!
//! An ingest token bound to agent ids stores batches of those agents only;
//! one bound to instances stores windows of those instances only, and no
//! other token may send them (checked by the Ingest service, which sees
//! the batch: see [`Caller`] and `ownership`).
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use tonic::{Request, Status, service::Interceptor};

use super::throttle::{LogLine, RefusedTokens};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the tokens file {path} has no token: put one bearer token per line (lines starting with # are comments)")]
    Empty { path: String },
    #[error("{path}:{line}: a token must be printable ASCII without spaces")]
    BadToken { path: String, line: usize },
    #[error(
        "{path}:{line}: expected `[ingest|read|both|annotate] TOKEN [agents=ID,ID...] [instances=NAME,NAME...]` \
         ({fields} fields found)"
    )]
    BadLine { path: String, line: usize, fields: usize },
    #[error(
        "{path}:{line}: a token must be at least {MIN_TOKEN_LEN} characters (this one has {length}), so it \
         cannot be guessed; make one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`"
    )]
    ShortToken { path: String, line: usize, length: usize },
    #[error(
        "{path}:{line}: this token looks chosen, not random ({why}), so it could be guessed; make one with \
         `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`"
    )]
    WeakToken { path: String, line: usize, why: String },
}

/// Bits a token's characters must carry, by their own distribution: 32
/// random hex characters carry about 115, one letter 32 times none.
pub const MIN_TOKEN_BITS: f64 = 96.0;

/// Why `secret` looks chosen rather than random, if it does: too little
/// entropy in how its characters are distributed (`aaaa...`, `abab...`).
fn weakness(secret: &[u8]) -> Option<String> {
    let mut counts = [0u32; 256];
    for b in secret {
        counts[*b as usize] += 1;
    }
    let len = secret.len() as f64;
    let per_char: f64 = counts.iter().filter(|n| **n > 0).map(|n| *n as f64 / len).map(|p| -p * p.log2()).sum();
    let bits = per_char * len;
    (bits < MIN_TOKEN_BITS).then(|| format!("about {bits:.0} bits in its characters, at least {MIN_TOKEN_BITS:.0}"))
}

/// Shortest token accepted: 32 random hex characters are 128 bits.
pub const MIN_TOKEN_LEN: usize = 32;

/// What a service needs a token to allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Ingest,
    Read,
    /// Writes markers (the Annotate service, `POST /api/annotations`).
    Annotate,
}

#[derive(Clone, Debug)]
struct Token {
    secret: Vec<u8>,
    /// Tells tokens apart without the secret (`Caller::token`).
    fingerprint: u64,
    ingest: bool,
    read: bool,
    annotate: bool,
    /// Agent ids an ingest token may send for; None: any.
    agents: Option<Arc<Vec<String>>>,
    /// Instances an ingest token may send windows of, and no other token
    /// may; None: any not pinned to another token.
    instances: Option<Arc<Vec<String>>>,
}

/// Who the caller's token lets it be, put in the request's extensions for
/// the Ingest service to check against the batch. Absent without a tokens
/// file.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Tells tokens apart (for in-flight limits) without holding the secret.
    pub token: u64,
    pub agents: Option<Arc<Vec<String>>>,
    pub instances: Option<Arc<Vec<String>>>,
}

impl Caller {
    /// Refuses a batch of an agent the token is not bound to.
    pub fn check_agent(&self, agent_id: &str) -> Result<(), Status> {
        match &self.agents {
            Some(agents) if !agents.iter().any(|a| a == agent_id) => Err(Status::permission_denied(format!(
                "this token may send batches of agents {agents:?} only, not of {agent_id:?}"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the token names `instance` among its own.
    pub fn pins(&self, instance: &str) -> bool {
        self.instances.as_ref().is_some_and(|i| i.iter().any(|n| n == instance))
    }
}

/// The accepted tokens, shared by both services and replaced whole on
/// reload; None: no authentication.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Arc<RwLock<Option<Arc<Vec<Token>>>>>,
    path: Option<PathBuf>,
    /// Refused tokens per client address, over every surface.
    refused: Arc<RefusedTokens>,
}

/// Never prints the tokens themselves.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("tokens", &self.token_count()).finish()
    }
}

fn parse(path: &Path) -> Result<Vec<Token>, AuthError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read { path: shown.clone(), source })?;
    let mut tokens = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Never echo the line: it holds a secret.
        let bad_line = || AuthError::BadLine { path: shown.clone(), line: n + 1, fields: fields.len() };
        let (role, secret, rest) = match fields.as_slice() {
            [secret] => ("both", *secret, &[][..]),
            [role, secret, rest @ ..] if rest.len() <= 2 => (*role, *secret, rest),
            _ => return Err(bad_line()),
        };
        let (ingest, read, annotate) = match role {
            "ingest" => (true, false, false),
            "read" => (false, true, false),
            "both" => (true, true, false),
            "annotate" => (false, false, true),
            _ => return Err(bad_line()),
        };
        let (mut agents, mut instances) = (None, None);
        for bound in rest {
            let list = |names: &str| -> Option<Arc<Vec<String>>> {
                Some(Arc::new(names.split(',').filter(|a| !a.is_empty()).map(str::to_string).collect()))
            };
            match bound.split_once('=') {
                Some(("agents", ids)) if agents.is_none() => agents = list(ids),
                Some(("instances", names)) if instances.is_none() => instances = list(names),
                _ => return Err(bad_line()),
            }
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthError::BadToken { path: shown, line: n + 1 });
        }
        if secret.len() < MIN_TOKEN_LEN {
            return Err(AuthError::ShortToken { path: shown, line: n + 1, length: secret.len() });
        }
        if let Some(why) = weakness(secret.as_bytes()) {
            return Err(AuthError::WeakToken { path: shown, line: n + 1, why });
        }
        tokens.push(Token {
            secret: secret.as_bytes().to_vec(),
            fingerprint: fingerprint(secret.as_bytes()),
            ingest,
            read,
            annotate,
            agents,
            instances,
        });
    }
    if tokens.is_empty() {
        return Err(AuthError::Empty { path: shown });
    }
    Ok(tokens)
}

impl Auth {
    pub fn open() -> Auth {
        Auth::default()
    }

    pub fn from_file(path: &Path) -> Result<Auth, AuthError> {
        let tokens = parse(path)?;
        Ok(Auth {
            tokens: Arc::new(RwLock::new(Some(Arc::new(tokens)))),
            path: Some(path.to_path_buf()),
            refused: Arc::default(),
        })
    }

    /// Reads the tokens file again (on SIGHUP). A file that fails to read
    /// or parse changes nothing: the tokens in force stay.
    pub fn reload(&self) -> Result<usize, AuthError> {
        let Some(path) = &self.path else { return Ok(0) };
        let tokens = parse(path)?;
        let count = tokens.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(tokens));
        Ok(count)
    }

    pub fn token_count(&self) -> usize {
        self.current().map_or(0, |t| t.len())
    }

    fn current(&self) -> Option<Arc<Vec<Token>>> {
        self.tokens.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The interceptor for a service that needs `role`.
    pub fn gate(&self, role: Role) -> Gate {
        Gate { auth: self.clone(), role }
    }

    /// Whether a token other than `caller`'s names `instance` among its own.
    pub fn pinned_elsewhere(&self, instance: &str, caller: Option<&Caller>) -> bool {
        let Some(tokens) = self.current() else { return false };
        tokens.iter().any(|t| {
            t.instances.as_ref().is_some_and(|i| i.iter().any(|n| n == instance))
                && caller.is_none_or(|c| c.token != t.fingerprint)
        })
    }

    /// `check`, for a caller at `peer` on `surface` (for the log): an
    /// address that had `throttle::MAX_REFUSED` tokens refused in its
    /// minute is refused at once, without a look at its token.
    pub fn check_from(
        &self,
        role: Role,
        header: Option<&[u8]>,
        peer: Option<IpAddr>,
        surface: &'static str,
    ) -> Result<Option<Caller>, Status> {
        if let Some(wait) = peer.and_then(|p| self.refused_wait(p)) {
            return Err(Status::resource_exhausted(format!(
                "too many refused tokens from this address; try again in {} s",
                wait.as_secs().max(1)
            )));
        }
        let checked = self.check(role, header);
        if let (Err(status), Some(peer)) = (&checked, peer)
            && status.code() == tonic::Code::Unauthenticated
        {
            self.note_refused(peer, surface, status.message());
        }
        checked
    }

    /// How long `peer` must wait before a token of its is looked at again.
    pub fn refused_wait(&self, peer: IpAddr) -> Option<std::time::Duration> {
        // Without tokens nothing is refused, so nothing is throttled.
        self.current()?;
        self.refused.wait(peer)
    }

    /// Counts a refused token from `peer`; one log line per address and
    /// minute, with how many the minute before refused.
    pub fn note_refused(&self, peer: IpAddr, surface: &'static str, why: &str) {
        match self.refused.refused(peer) {
            (LogLine::First, 0) => tracing::info!(%peer, surface, reason = why, "token refused"),
            (LogLine::First, quiet) => tracing::info!(
                %peer, surface, reason = why, refused_in_the_minute_before = quiet + 1, "token refused"
            ),
            (LogLine::Quiet, _) => {}
        }
    }

    pub(super) fn check(&self, role: Role, header: Option<&[u8]>) -> Result<Option<Caller>, Status> {
        let Some(tokens) = self.current() else { return Ok(None) };
        let Some(header) = header else {
            return Err(Status::unauthenticated(
                "missing authorization: this collector requires `authorization: Bearer <token>` (agent and CLI: --token-file)",
            ));
        };
        let presented = header
            .strip_prefix(b"Bearer ")
            .or_else(|| header.strip_prefix(b"bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization is not of the form `Bearer <token>`"))?;
        // Compare with every token without stopping early, in constant time
        // per token, so timing does not tell how much of a guess was right.
        let mut found: Option<&Token> = None;
        for token in tokens.iter() {
            if constant_time_eq(&token.secret, presented) {
                found = Some(token);
            }
        }
        let token = found.ok_or_else(|| Status::unauthenticated("bearer token not accepted by this collector"))?;
        let may = match role {
            Role::Ingest => token.ingest,
            Role::Read => token.read,
            Role::Annotate => token.annotate,
        };
        match may {
            false => Err(Status::permission_denied(format!(
                "this token may {}, not {}",
                token.roles(),
                match role {
                    Role::Ingest => "send batches to the collector",
                    Role::Read => "read the fleet's data",
                    Role::Annotate => "write markers (that takes a token of the `annotate` role)",
                }
            ))),
            true => Ok(Some(Caller {
                token: token.fingerprint,
                agents: token.agents.clone(),
                instances: token.instances.clone(),
            })),
        }
    }
}

impl Token {
    /// What the token may do, for a refusal to say.
    fn roles(&self) -> &'static str {
        match (self.ingest, self.read, self.annotate) {
            (true, true, _) => "send batches and read",
            (true, false, _) => "send batches",
            (false, true, _) => "read the fleet's data",
            (false, false, _) => "write markers",
        }
    }
}

fn fingerprint(secret: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(secret)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The token check in front of one service.
#[derive(Clone, Debug)]
pub struct Gate {
    auth: Auth,
    role: Role,
}

impl Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request.metadata().get("authorization").map(|v| v.as_bytes());
        let peer = request.remote_addr().map(|a| a.ip());
        if let Some(caller) = self.auth.check_from(self.role, header, peer, "grpc")? {
            request.extensions_mut().insert(caller);
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("sqlbee-auth-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn tokens_file() {
        let (dir, path) = file(
            "plain",
            "# agents\n  s3cret-0123456789abcdef0123456789abcdef  \n\nother-token-0123456789abcdef0123456789abcdef\n",
        );
        let auth = Auth::from_file(&path).unwrap();
        assert_eq!(auth.token_count(), 2);
        auth.check(Role::Ingest, Some(b"Bearer s3cret-0123456789abcdef0123456789abcdef")).unwrap();
        auth.check(Role::Read, Some(b"Bearer other-token-0123456789abcdef0123456789abcdef")).unwrap();
        let refused = |header: Option<&[u8]>| auth.check(Role::Ingest, header).unwrap_err();
        assert_eq!(refused(Some(b"Bearer s3cre")).code(), tonic::Code::Unauthenticated);
        assert_eq!(refused(Some(b"s3cret-0123456789abcdef0123456789abcdef")).code(), tonic::Code::Unauthenticated);
        assert!(refused(None).message().contains("missing authorization"));
        Auth::open().check(Role::Ingest, None).unwrap();
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(Auth::from_file(&path).unwrap_err().to_string().contains("no token"));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn roles_and_bound_agents() {
        let (dir, path) = file(
            "roles",
            "ingest in-1-0123456789abcdef0123456789abcdef agents=web-1,web-2\nread rd-1-0123456789abcdef0123456789abcdef\nboth all-1-0123456789abcdef0123456789abcdef\n",
        );
        let auth = Auth::from_file(&path).unwrap();
        let bound = auth.check(Role::Ingest, Some(b"Bearer in-1-0123456789abcdef0123456789abcdef")).unwrap().unwrap();
        bound.check_agent("web-2").unwrap();
        assert_eq!(bound.check_agent("db-9").unwrap_err().code(), tonic::Code::PermissionDenied);
        let denied = |role, header: &[u8]| auth.check(role, Some(header)).unwrap_err().code();
        assert_eq!(denied(Role::Read, b"Bearer in-1-0123456789abcdef0123456789abcdef"), tonic::Code::PermissionDenied);
        assert_eq!(
            denied(Role::Ingest, b"Bearer rd-1-0123456789abcdef0123456789abcdef"),
            tonic::Code::PermissionDenied
        );
        let reader = auth.check(Role::Read, Some(b"Bearer rd-1-0123456789abcdef0123456789abcdef")).unwrap().unwrap();
        assert!(reader.agents.is_none() && reader.instances.is_none());
        let both = auth.check(Role::Ingest, Some(b"Bearer all-1-0123456789abcdef0123456789abcdef")).unwrap().unwrap();
        both.check_agent("db-9").unwrap();
        assert_ne!(both.token, bound.token);
        std::fs::write(&path, "annotate ci-1-0123456789abcdef0123456789abcdef\n").unwrap();
        let marks = Auth::from_file(&path).unwrap();
        let ci = Some(&b"Bearer ci-1-0123456789abcdef0123456789abcdef"[..]);
        marks.check(Role::Annotate, ci).unwrap();
        for role in [Role::Read, Role::Ingest] {
            let refused = marks.check(role, ci).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::PermissionDenied);
            assert!(refused.message().starts_with("this token may write markers"), "{}", refused.message());
        }
        assert_eq!(
            auth.check(Role::Annotate, Some(b"Bearer all-1-0123456789abcdef0123456789abcdef")).unwrap_err().code(),
            tonic::Code::PermissionDenied,
            "both means ingest and read, as before: markers need their own role"
        );
        for bad in ["write tok\n", "ingest tok agents\n", "read a b c\n", "ingest tok agents=a agents=b\n"] {
            std::fs::write(&path, bad).unwrap();
            assert!(Auth::from_file(&path).unwrap_err().to_string().contains(":1:"), "{bad}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn tokens_pin_instances() {
        let (dir, path) = file(
            "instances",
            "ingest db7-0123456789abcdef0123456789abcdef instances=db-7:3306,db-7:3307 agents=db-7\n\
             ingest any-0123456789abcdef0123456789abcdef\n",
        );
        let auth = Auth::from_file(&path).unwrap();
        let db7 = auth.check(Role::Ingest, Some(b"Bearer db7-0123456789abcdef0123456789abcdef")).unwrap().unwrap();
        let any = auth.check(Role::Ingest, Some(b"Bearer any-0123456789abcdef0123456789abcdef")).unwrap().unwrap();
        assert!(db7.pins("db-7:3307") && !db7.pins("db-8:3306") && !any.pins("db-7:3306"));
        db7.check_agent("db-7").unwrap();
        assert!(auth.pinned_elsewhere("db-7:3306", Some(&any)));
        assert!(!auth.pinned_elsewhere("db-7:3306", Some(&db7)));
        assert!(!auth.pinned_elsewhere("db-8:3306", Some(&any)));
        assert!(!Auth::open().pinned_elsewhere("db-7:3306", None));
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn reload_replaces_the_tokens_or_keeps_them() {
        let (dir, path) = file("reload", "old-token-0123456789abcdef0123456789abcdef\n");
        let auth = Auth::from_file(&path).unwrap();
        let gate = auth.gate(Role::Read);
        std::fs::write(&path, "read new-token-0123456789abcdef0123456789abcdef\n").unwrap();
        assert_eq!(auth.reload().unwrap(), 1);
        assert!(
            gate.auth.check(Role::Read, Some(b"Bearer new-token-0123456789abcdef0123456789abcdef")).is_ok(),
            "a gate sees the reload"
        );
        assert!(gate.auth.check(Role::Read, Some(b"Bearer old-token-0123456789abcdef0123456789abcdef")).is_err());
        std::fs::write(&path, "").unwrap();
        assert!(auth.reload().is_err());
        assert!(
            auth.check(Role::Read, Some(b"Bearer new-token-0123456789abcdef0123456789abcdef")).is_ok(),
            "a bad file keeps the tokens in force"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn chosen_tokens_are_refused_at_load_and_random_ones_pass() {
        for weak in ["a".repeat(32), "ab".repeat(16), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab".into()] {
            let (dir, path) = file("weak", &format!("ingest {weak}\n"));
            let err = Auth::from_file(&path).unwrap_err();
            assert!(matches!(err, AuthError::WeakToken { line: 1, .. }), "{weak}: {err}");
            assert!(err.to_string().contains("looks chosen"), "{err}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        // 32 random bytes as hex, as the manual makes them.
        let mut random = [0u8; 32];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut random).unwrap();
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(weakness(hex.as_bytes()), None, "{hex}");
        assert_eq!(weakness(&hex.as_bytes()[..32]), None, "{hex}");
    }
}
