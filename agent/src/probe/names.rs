//! What the schema and account hashes in statement records stand for, as
//! the kernel side named them (`NameRecord`s in the `NAMES` ring). One
//! table per attached server, bounded.
use std::{collections::HashMap, sync::Arc};

use sqlbee_kernel_abi::{NameRecord, name_kind};

/// A connection's login: user and client host (host name or address).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Account {
    pub user: String,
    pub host: String,
}

/// A stored program: `schema.name`, and its kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Program {
    pub name: String,
    /// `procedure`, `function`, `trigger`, `event`, `anonymous` or `unknown`.
    pub kind: &'static str,
}

pub fn program_kind_name(kind: u32) -> &'static str {
    use sqlbee_kernel_abi::program_kind as k;
    match kind {
        k::PROCEDURE => "procedure",
        k::FUNCTION => "function",
        k::TRIGGER => "trigger",
        k::EVENT => "event",
        k::ANONYMOUS => "anonymous",
        _ => "unknown",
    }
}

/// Names kept per server; past this, the table starts over (names come
/// again with each new connection).
const MAX_NAMES: usize = 65_536;

/// What an unnamed hash is shown as: its record was lost (a full ring).
pub const UNKNOWN_SCHEMA: &str = "(unknown schema)";

/// A connection the kernel named, for its client to be found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamedConnection {
    pub connection: u64,
    /// The server's fd for the connection's socket (-1: unknown).
    pub socket_fd: i32,
    /// The account's own hash.
    pub login_hash: u64,
    /// The kernel found no client key for it.
    pub client_pending: bool,
}

/// Connections waiting for their client to be named; past this, the
/// oldest are left unnamed (their statements keep coming as records).
const MAX_NEW_CONNECTIONS: usize = 65_536;

#[derive(Default)]
pub struct Names {
    schemas: HashMap<u64, Arc<str>>,
    accounts: HashMap<u64, Arc<Account>>,
    /// Programs by hash: `schema.name`.
    programs: HashMap<u64, Arc<str>>,
    /// Accounts named since the last `take_connections`.
    new_connections: Vec<NamedConnection>,
}

impl Names {
    /// Takes one ring record; false when it is not one.
    pub fn learn(&mut self, record: &[u8]) -> bool {
        if record.len() < std::mem::size_of::<NameRecord>() {
            return false;
        }
        // SAFETY: length checked; plain integers and bytes.
        let name: NameRecord = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
        let text =
            |bytes: &[u8], len: u32| String::from_utf8_lossy(&bytes[..(len as usize).min(bytes.len())]).into_owned();
        if self.schemas.len() + self.accounts.len() + self.programs.len() >= MAX_NAMES {
            self.schemas.clear();
            self.accounts.clear();
            self.programs.clear();
        }
        match name.kind {
            name_kind::SCHEMA => {
                self.schemas.insert(name.hash, Arc::from(text(&name.name, name.name_len)));
            }
            name_kind::PROGRAM => {
                let qualified = format!("{}.{}", text(&name.name, name.name_len), text(&name.host, name.host_len));
                self.programs.insert(name.hash, Arc::from(qualified));
            }
            name_kind::ACCOUNT => {
                let account = Account { user: text(&name.name, name.name_len), host: text(&name.host, name.host_len) };
                self.accounts.insert(name.hash, Arc::new(account));
                if name.connection != 0 && self.new_connections.len() < MAX_NEW_CONNECTIONS {
                    self.new_connections.push(NamedConnection {
                        connection: name.connection,
                        socket_fd: name.socket_fd,
                        login_hash: name.hash,
                        client_pending: name.client_pending != 0,
                    });
                }
            }
            _ => return false,
        }
        true
    }

    /// The schema a hash names; 0 is "no schema".
    pub fn schema(&self, hash: u64) -> Option<Arc<str>> {
        (hash != 0).then(|| self.schemas.get(&hash).cloned().unwrap_or_else(|| Arc::from(UNKNOWN_SCHEMA)))
    }

    /// Whether `hash` is "no schema" or a schema named already.
    pub fn knows_schema(&self, hash: u64) -> bool {
        hash == 0 || self.schemas.contains_key(&hash)
    }

    /// Whether `hash` names a stored program already (0: a block with no
    /// name, which has nothing to wait for).
    pub fn knows_program(&self, hash: u64) -> bool {
        hash == 0 || self.programs.contains_key(&hash)
    }

    pub fn account(&self, hash: u64) -> Option<Arc<Account>> {
        self.accounts.get(&hash).cloned()
    }

    /// Connections named since the last call.
    pub fn take_connections(&mut self) -> Vec<NamedConnection> {
        std::mem::take(&mut self.new_connections)
    }

    /// `hash` (an account's with a client key mixed in) names the account
    /// `login_hash` names.
    pub fn alias_account(&mut self, hash: u64, login_hash: u64) {
        if let Some(account) = self.accounts.get(&login_hash).cloned() {
            self.accounts.insert(hash, account);
        }
    }

    /// The program a nested statement ran in; one whose name was lost (or
    /// a block with none) is named by its kind.
    pub fn program(&self, hash: u64, kind: u32) -> Program {
        let kind = program_kind_name(kind);
        let name = self.programs.get(&hash).map_or_else(|| format!("({kind})"), |n| n.to_string());
        Program { name, kind }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, hash: u64, name: &str, host: &str) -> Vec<u8> {
        let mut r =
            NameRecord { kind, hash, name_len: name.len() as u32, host_len: host.len() as u32, ..Default::default() };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        r.host[..host.len()].copy_from_slice(host.as_bytes());
        // SAFETY: a plain `#[repr(C)]` value viewed as its bytes.
        unsafe { std::slice::from_raw_parts((&r as *const NameRecord).cast::<u8>(), std::mem::size_of::<NameRecord>()) }
            .to_vec()
    }

    #[test]
    fn names_schemas_and_accounts_by_hash() {
        let mut names = Names::default();
        assert!(names.learn(&record(name_kind::SCHEMA, 7, "shop", "")));
        assert!(names.learn(&record(name_kind::ACCOUNT, 9, "app", "10.0.0.5")));
        assert!(!names.learn(&record(99, 1, "x", "")));
        assert!(!names.learn(&[0u8; 8]));
        assert_eq!(names.schema(7).as_deref(), Some("shop"));
        assert_eq!(names.schema(0), None);
        assert_eq!(names.schema(8).as_deref(), Some(UNKNOWN_SCHEMA));
        assert!(names.knows_schema(7) && names.knows_schema(0) && !names.knows_schema(8));
        let account = names.account(9).unwrap();
        assert_eq!((account.user.as_str(), account.host.as_str()), ("app", "10.0.0.5"));
        assert!(names.account(10).is_none());
    }
}
