//! Each connection's client, named once per connection: the agent finds
//! who holds the other end of its socket (`discover::ClientResolver`),
//! keeps it, and writes a key for it into the kernel's `CLIENT_KEYS`. The
//! kernel mixes that key into the connection's account hash, so its kernel
//! digests count statements per client too, and until the key is there it
//! sends the connection's statements as records, which name their
//! connection. Every statement is thus counted by its client, or under
//! none when the client could not be found (its connection closed first).
//! With the login, what the client said it is at connect (its program) is
//! asked for on a thread of its own (`discover::AttrAsker`) before the key
//! is written: meanwhile the connection's statements come as records and
//! are held back (`is_awaiting`) until its client is whole, so that is
//! exact too.
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use sqlbee_kernel_abi::with_client;
use tracing::{debug, warn};

use super::{
    ProbeError,
    names::{NamedConnection, Names},
};
use crate::{
    discover::{AttrAsker, Client, ClientConnection, ClientResolver},
    server_login::ServerLogin,
};

/// Connections and client keys remembered per server; past this, the
/// tables start over (a connection named again is looked up again).
const MAX_REMEMBERED: usize = 65_536;
/// Connections waiting for their attributes at once; past this, new ones
/// are named without.
const MAX_AWAITING: usize = 10_000;
/// A connection waits at most this long for its attributes (the asker's
/// waits are bounded well below it).
const MAX_WAIT: Duration = Duration::from_secs(3);

/// A connection whose peer is known, waiting for its attributes.
struct Awaiting {
    named: NamedConnection,
    client: Client,
    since: Instant,
}

pub struct Clients {
    keys: BpfHashMap<MapData, u64, u64>,
    server_pid: u32,
    resolver: ClientResolver,
    /// With a login: asks for the connection attributes.
    attrs: Option<AttrAsker>,
    awaiting: HashMap<u64, Awaiting>,
    /// The waiting connections, oldest first, for their deadline.
    waiting_since: VecDeque<(Instant, u64)>,
    /// By account hash with a client key in it.
    by_account: HashMap<u64, Arc<Client>>,
    /// By connection id: its key, and its client for records sent before
    /// the key was written (`None`: looked for, not found).
    by_connection: HashMap<u64, (u64, Option<Arc<Client>>)>,
    /// One shared value per distinct client.
    interned: HashMap<Client, (u64, Arc<Client>)>,
}

impl Clients {
    pub fn new(ebpf: &mut aya::Ebpf, server_pid: u32, login: Option<ServerLogin>) -> Result<Self, ProbeError> {
        let map = ebpf
            .take_map("CLIENT_KEYS")
            .ok_or_else(|| ProbeError::Map { map: "CLIENT_KEYS", detail: "not in object".into() })?;
        let keys =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map { map: "CLIENT_KEYS", detail: e.to_string() })?;
        let attrs = login.and_then(|login| match AttrAsker::start(login, server_pid) {
            Ok(asker) => Some(asker),
            Err(error) => {
                warn!(pid = server_pid, %error, "no thread to read connection attributes; clients have no program");
                None
            }
        });
        Ok(Self {
            keys,
            server_pid,
            resolver: ClientResolver::default(),
            attrs,
            awaiting: HashMap::new(),
            waiting_since: VecDeque::new(),
            by_account: HashMap::new(),
            by_connection: HashMap::new(),
            interned: HashMap::new(),
        })
    }

    /// Names the clients of the connections `names` learnt since last time,
    /// and hands the kernel their keys (with a login: once their attributes
    /// came, here on a later call).
    pub fn name_new_connections(&mut self, names: &mut Names) {
        self.take_answers(names);
        let mut new = names.take_connections();
        // Named again (a changed user, another thread): the account it now
        // runs as gets its hash with the key, and when the kernel did not
        // find the key (gone from its map since), the key goes in again.
        let mut known = Vec::new();
        new.retain(|c| {
            if let Some(waiting) = self.awaiting.get_mut(&c.connection) {
                waiting.named = *c;
                return false;
            }
            match self.by_connection.get(&c.connection) {
                Some((key, client)) => {
                    known.push((*c, *key, client.clone()));
                    false
                }
                None => true,
            }
        });
        for (named, key, client) in known {
            if named.client_pending {
                self.write_key(named.connection, key);
            }
            if let Some(client) = client {
                let hash = with_client(named.login_hash, key);
                names.alias_account(hash, named.login_hash);
                self.by_account.insert(hash, client);
            }
        }
        if new.is_empty() {
            return;
        }
        if self.by_connection.len() + new.len() > MAX_REMEMBERED {
            self.by_connection.clear();
            self.by_account.clear();
            self.interned.clear();
        }
        let sockets: Vec<ClientConnection> =
            new.iter().map(|c| ClientConnection { server_pid: self.server_pid, socket_fd: c.socket_fd }).collect();
        let found = self.resolver.resolve(&sockets);
        let now = Instant::now();
        let mut asked = Vec::new();
        for (named, client) in new.into_iter().zip(found) {
            if self.attrs.is_some() && self.awaiting.len() < MAX_AWAITING {
                asked.push(named.connection);
                self.waiting_since.push_back((now, named.connection));
                self.awaiting.insert(named.connection, Awaiting { named, client, since: now });
            } else {
                self.settle(named, client, names);
            }
        }
        if !asked.is_empty() && !self.attrs.as_ref().is_some_and(|a| a.ask(asked)) {
            self.attrs = None;
            self.settle_all(names);
        }
    }

    /// Whether records of `connection` wait for its client to be whole.
    pub fn is_awaiting(&self, connection: u64) -> bool {
        self.awaiting.contains_key(&connection)
    }

    /// Names every waiting connection with what is known now.
    pub fn settle_all(&mut self, names: &mut Names) {
        self.waiting_since.clear();
        for (_, waiting) in std::mem::take(&mut self.awaiting) {
            self.settle(waiting.named, waiting.client, names);
        }
    }

    /// Completes the waiting connections the asker answered for, and those
    /// that waited too long.
    fn take_answers(&mut self, names: &mut Names) {
        let Some(asker) = &self.attrs else { return };
        let Some(answers) = asker.answers() else {
            warn!(pid = self.server_pid, "the connection attributes thread ended; clients have no program");
            self.attrs = None;
            self.settle_all(names);
            return;
        };
        for (connections, mut said) in answers {
            for connection in connections {
                let Some(Awaiting { named, mut client, .. }) = self.awaiting.remove(&connection) else { continue };
                if let Some(attrs) = said.remove(&connection) {
                    client.program = attrs.program;
                    client.driver = attrs.driver;
                    client.client_pid = attrs.pid;
                }
                self.settle(named, client, names);
            }
        }
        while let Some(&(since, connection)) = self.waiting_since.front() {
            if since.elapsed() <= MAX_WAIT {
                break;
            }
            self.waiting_since.pop_front();
            // Still waiting since then (not answered, nor asked again).
            if self.awaiting.get(&connection).is_some_and(|w| w.since == since) {
                let waiting = self.awaiting.remove(&connection).expect("looked up above");
                self.settle(waiting.named, waiting.client, names);
            }
        }
    }

    /// Gives a connection its client: its key to the kernel, and the
    /// account hash with the key in it named.
    fn settle(&mut self, named: NamedConnection, client: Client, names: &mut Names) {
        let key = if client.is_unknown() { 0 } else { self.intern(client.clone()).0 };
        self.write_key(named.connection, key);
        if key == 0 {
            self.by_connection.insert(named.connection, (0, None));
            return;
        }
        let client = self.intern(client).1;
        let hash = with_client(named.login_hash, key);
        names.alias_account(hash, named.login_hash);
        self.by_account.insert(hash, client.clone());
        self.by_connection.insert(named.connection, (key, Some(client)));
    }

    fn write_key(&mut self, connection: u64, key: u64) {
        if let Err(error) = self.keys.insert(&connection, &key, 0) {
            debug!(pid = self.server_pid, %error, "writing a client key failed");
        }
    }

    /// The client of a statement counted under `account_hash`, or sent as a
    /// record by `connection`.
    pub fn client(&self, account_hash: u64, connection: u64) -> Option<Arc<Client>> {
        self.by_account.get(&account_hash).or_else(|| self.by_connection.get(&connection)?.1.as_ref()).cloned()
    }

    /// The client an account hash with a client key in it names.
    pub fn of_account(&self, account_hash: u64) -> Option<Arc<Client>> {
        self.by_account.get(&account_hash).cloned()
    }

    /// The client's key (never 0) and its shared value.
    fn intern(&mut self, client: Client) -> (u64, Arc<Client>) {
        if let Some(known) = self.interned.get(&client) {
            return known.clone();
        }
        let text = format!("{client:?}");
        let key = xxhash_rust::xxh3::xxh3_64(text.as_bytes()) | 1;
        let value = (key, Arc::new(client.clone()));
        self.interned.insert(client, value.clone());
        value
    }
}

#[cfg(test)]
mod tests {
    use sqlbee_kernel_abi::with_client;

    #[test]
    fn a_client_key_makes_another_account_hash() {
        assert_eq!(with_client(0x1234_5679, 0), 0x1234_5679, "no key: the account's own hash");
        assert_eq!(with_client(0, 77), 0, "no account: none");
        let (a, b) = (with_client(0x1234_5679, 77), with_client(0x1234_5679, 78));
        assert!(a != b && a != 0x1234_5679 && a & 1 == 1 && b & 1 == 1);
    }
}
