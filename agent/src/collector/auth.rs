//! Bearer-token check for the Ingest and Query services (not for health,
//! which load balancers probe without credentials). Tokens come from a
//! file, one per line; without a file every caller is let in. Runs before
//! the request body is read, so a refused caller costs no decoding.
use std::{path::Path, sync::Arc};

use tonic::{Request, Status, service::Interceptor};

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
}

/// Accepted tokens; None: no authentication.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Option<Arc<Vec<Vec<u8>>>>,
}

/// Never prints the tokens themselves.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("tokens", &self.token_count()).finish()
    }
}

impl Auth {
    pub fn open() -> Auth {
        Auth { tokens: None }
    }

    pub fn from_file(path: &Path) -> Result<Auth, AuthError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read { path: shown.clone(), source })?;
        let mut tokens = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !line.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(AuthError::BadToken { path: shown, line: n + 1 });
            }
            tokens.push(line.as_bytes().to_vec());
        }
        if tokens.is_empty() {
            return Err(AuthError::Empty { path: shown });
        }
        Ok(Auth { tokens: Some(Arc::new(tokens)) })
    }

    pub fn token_count(&self) -> usize {
        self.tokens.as_ref().map_or(0, |t| t.len())
    }

    fn check(&self, header: Option<&[u8]>) -> Result<(), Status> {
        let Some(tokens) = &self.tokens else { return Ok(()) };
        let Some(header) = header else {
            return Err(Status::unauthenticated(
                "missing authorization: this collector requires `authorization: Bearer <token>` (agent and CLI: --token-file)",
            ));
        };
        let presented = header
            .strip_prefix(b"Bearer ")
            .or_else(|| header.strip_prefix(b"bearer "))
            .ok_or_else(|| Status::unauthenticated("authorization is not of the form `Bearer <token>`"))?;
        // Check every token without stopping early, in constant time per
        // token, so timing does not tell how much of a guess was right.
        let mut accepted = false;
        for token in tokens.iter() {
            accepted |= constant_time_eq(token, presented);
        }
        if accepted { Ok(()) } else { Err(Status::unauthenticated("bearer token not accepted by this collector")) }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

impl Interceptor for Auth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request.metadata().get("authorization").map(|v| v.as_bytes());
        self.check(header)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_file() {
        let dir = std::env::temp_dir().join(format!("sqlbee-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "# agents\n  s3cret  \n\nother-token\n").unwrap();
        let auth = Auth::from_file(&path).unwrap();
        assert_eq!(auth.token_count(), 2);
        auth.check(Some(b"Bearer s3cret")).unwrap();
        auth.check(Some(b"Bearer other-token")).unwrap();
        assert_eq!(auth.check(Some(b"Bearer s3cre")).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(auth.check(Some(b"s3cret")).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(auth.check(None).unwrap_err().message().contains("missing authorization"));
        Auth::open().check(None).unwrap();
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(Auth::from_file(&path).unwrap_err().to_string().contains("no token"));
        std::fs::remove_dir_all(dir).ok();
    }
}
