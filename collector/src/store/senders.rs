//! Who sent a digest's statements, merged over many rows: the accounts
//! that ran them, the clients that sent them, their query tags and the
//! slowest traced statements.
//! Every backend stores the three together in one column: a raw row as a
//! `DigestStats` holding only them (`blob::encode_senders`), a rollup
//! bucket as `Stored`, whose fields have the same numbers, so one decoder
//! reads both, and rows from before tags read as rows without them.
use std::collections::BTreeMap;

use prost::Message as _;
use sqlbee_proto::v1::{AccountCount, ClientCount, TagCount, TagValue, TraceExemplar};

/// The stored column. A `DigestStats`' one `exemplar` (field 26) reads as
/// a list of one: a rollup bucket keeps its `TOP_EXEMPLARS` slowest, so a
/// range read from buckets lists what its raw rows would.
#[derive(Clone, PartialEq, prost::Message)]
struct Stored {
    #[prost(message, repeated, tag = "16")]
    accounts: Vec<AccountCount>,
    #[prost(message, repeated, tag = "25")]
    tags: Vec<TagCount>,
    #[prost(message, repeated, tag = "26")]
    exemplars: Vec<TraceExemplar>,
    #[prost(message, repeated, tag = "27")]
    clients: Vec<ClientCount>,
}

/// Accounts an answer lists per digest; the rest are in none.
pub const TOP_ACCOUNTS: usize = 10;
/// Clients an answer lists per digest; the rest are in none.
pub const TOP_CLIENTS: usize = 10;
/// Clients a rollup bucket keeps per digest: the most frequent. Past it
/// the rarest are dropped, so a range read from rollups lists at least
/// what the raw rows hold for the clients it lists.
pub const STORED_CLIENTS: usize = 256;
/// Values an answer lists per tag key; the rest are in its `other`.
pub const TOP_TAG_VALUES: usize = 10;
/// Values a rollup bucket keeps per tag key. Past it the rarest go to
/// `other`: the listed counts of a range read from rollups are then at
/// least what the raw rows hold, never more, and `other` keeps the sums
/// exact.
pub const STORED_TAG_VALUES: usize = 256;
/// Trace exemplars an answer (and a rollup bucket) keeps: the slowest.
pub const TOP_EXEMPLARS: usize = 5;

/// The three breakdowns of one digest, as an answer lists them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Senders {
    pub accounts: Vec<AccountCount>,
    pub clients: Vec<ClientCount>,
    pub tags: Vec<TagCount>,
    pub exemplars: Vec<TraceExemplar>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergedSenders {
    accounts: BTreeMap<(String, String), u64>,
    /// By everything but the count.
    clients: BTreeMap<ClientKey, u64>,
    /// By key: counts per value, and statements whose value is not listed.
    tags: BTreeMap<String, (BTreeMap<String, u64>, u64)>,
    /// Slowest first, at most `TOP_EXEMPLARS`.
    exemplars: Vec<TraceExemplar>,
}

impl MergedSenders {
    /// Adds one stored column's value (empty: nothing).
    pub fn add_stored(&mut self, stored: &[u8]) -> Result<(), prost::DecodeError> {
        if !stored.is_empty() {
            let holder = Stored::decode(stored)?;
            self.add_clients(holder.clients);
            self.add(holder.accounts, holder.tags, holder.exemplars);
        }
        Ok(())
    }

    pub fn add_clients(&mut self, clients: Vec<ClientCount>) {
        for c in clients {
            let slot = self.clients.entry(ClientKey::of(&c)).or_default();
            *slot = slot.saturating_add(c.count);
        }
    }

    pub fn add(
        &mut self,
        accounts: Vec<AccountCount>,
        tags: Vec<TagCount>,
        exemplars: impl IntoIterator<Item = TraceExemplar>,
    ) {
        for a in accounts {
            let slot = self.accounts.entry((a.user, a.host)).or_default();
            *slot = slot.saturating_add(a.count);
        }
        for tag in tags {
            let (values, other) = self.tags.entry(tag.key).or_default();
            *other = other.saturating_add(tag.other);
            for v in tag.values {
                let slot = values.entry(v.value).or_default();
                *slot = slot.saturating_add(v.count);
            }
        }
        for e in exemplars {
            if self.exemplars.iter().any(|k| k.trace_id == e.trace_id && k.span_id == e.span_id) {
                continue;
            }
            // Slowest first, ties by id: the same whatever order rows come in.
            let at = self.exemplars.partition_point(|k| {
                (std::cmp::Reverse(k.duration_ns), &k.trace_id, &k.span_id)
                    < (std::cmp::Reverse(e.duration_ns), &e.trace_id, &e.span_id)
            });
            if at < TOP_EXEMPLARS {
                self.exemplars.insert(at, e);
                self.exemplars.truncate(TOP_EXEMPLARS);
            }
        }
    }

    /// What an answer lists: the most frequent accounts and tag values,
    /// ties by name, and the slowest exemplars.
    pub fn into_top(self) -> Senders {
        let mut accounts: Vec<AccountCount> =
            self.accounts.into_iter().map(|((user, host), count)| AccountCount { user, host, count }).collect();
        accounts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| (&a.user, &a.host).cmp(&(&b.user, &b.host))));
        accounts.truncate(TOP_ACCOUNTS);
        Senders {
            accounts,
            clients: client_counts(self.clients, TOP_CLIENTS),
            tags: tag_counts(self.tags, TOP_TAG_VALUES),
            exemplars: self.exemplars,
        }
    }

    /// What a rollup bucket stores: every account (so a later merge ranks
    /// them as the raw rows would), the `STORED_TAG_VALUES` most frequent
    /// values per key, and the `TOP_EXEMPLARS` slowest exemplars.
    pub fn into_stored(self) -> Vec<u8> {
        let accounts =
            self.accounts.into_iter().map(|((user, host), count)| AccountCount { user, host, count }).collect();
        let tags = tag_counts(self.tags, STORED_TAG_VALUES);
        let clients = client_counts(self.clients, STORED_CLIENTS);
        Stored { accounts, tags, exemplars: self.exemplars, clients }.encode_to_vec()
    }
}

/// A `ClientCount` but its count: (address, process, pid, container,
/// container id, pod, namespace, program, driver, client pid).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct ClientKey(String, String, u32, String, String, String, String, String, String, u32);

impl ClientKey {
    fn of(c: &ClientCount) -> Self {
        let c = c.clone();
        Self(
            c.address,
            c.process,
            c.pid,
            c.container,
            c.container_id,
            c.pod,
            c.namespace,
            c.program,
            c.driver,
            c.client_pid,
        )
    }

    fn with_count(self, count: u64) -> ClientCount {
        let Self(address, process, pid, container, container_id, pod, namespace, program, driver, client_pid) = self;
        ClientCount {
            address,
            process,
            pid,
            container,
            container_id,
            pod,
            namespace,
            program,
            driver,
            client_pid,
            count,
        }
    }
}

/// The `top` most frequent clients, ties by what names them (the map's
/// order, which a stable sort keeps).
fn client_counts(clients: BTreeMap<ClientKey, u64>, top: usize) -> Vec<ClientCount> {
    let mut listed: Vec<ClientCount> = clients.into_iter().map(|(c, count)| c.with_count(count)).collect();
    listed.sort_by_key(|c| std::cmp::Reverse(c.count));
    listed.truncate(top);
    listed
}

/// Per key, its `top` most frequent values (ties by value) and `other`
/// for the rest.
fn tag_counts(tags: BTreeMap<String, (BTreeMap<String, u64>, u64)>, top: usize) -> Vec<TagCount> {
    tags.into_iter()
        .map(|(key, (values, mut other))| {
            let mut values: Vec<TagValue> =
                values.into_iter().map(|(value, count)| TagValue { value, count }).collect();
            values.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.cmp(&b.value)));
            for rest in values.drain(values.len().min(top)..) {
                other = other.saturating_add(rest.count);
            }
            TagCount { key, values, other }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exemplar(id: char, duration_ns: u64) -> TraceExemplar {
        TraceExemplar { trace_id: id.to_string().repeat(32), span_id: id.to_string().repeat(16), duration_ns }
    }

    fn tag(key: &str, values: &[(&str, u64)], other: u64) -> TagCount {
        TagCount {
            key: key.into(),
            values: values.iter().map(|(v, count)| TagValue { value: v.to_string(), count: *count }).collect(),
            other,
        }
    }

    #[test]
    fn accounts_keep_the_top() {
        let mut senders = MergedSenders::default();
        let account = |user: &str, count| AccountCount { user: user.into(), host: "h".into(), count };
        senders.add((0..12).map(|i| account(&format!("u{i:02}"), i)).collect(), vec![], None);
        senders.add(vec![account("u00", 100)], vec![], None);
        let top = senders.into_top().accounts;
        assert_eq!(top.len(), TOP_ACCOUNTS);
        assert_eq!((top[0].user.as_str(), top[0].count), ("u00", 100));
        assert_eq!(top[1].user, "u11");
    }

    #[test]
    fn tags_merge_per_value_and_the_rest_is_other() {
        let mut senders = MergedSenders::default();
        let many: Vec<(String, u64)> = (0..20).map(|i| (format!("v{i:02}"), 1)).collect();
        let many: Vec<(&str, u64)> = many.iter().map(|(v, n)| (v.as_str(), *n)).collect();
        senders.add(vec![], vec![tag("controller", &many, 3)], Some(exemplar('a', 5)));
        senders.add(vec![], vec![tag("controller", &[("v19", 9)], 0), tag("action", &[("show", 2)], 0)], None);
        let top = senders.clone().into_top();
        let controller = top.tags.iter().find(|t| t.key == "controller").unwrap();
        assert_eq!(controller.values.len(), TOP_TAG_VALUES);
        assert_eq!((controller.values[0].value.as_str(), controller.values[0].count), ("v19", 10));
        let listed: u64 = controller.values.iter().map(|v| v.count).sum();
        assert_eq!(listed + controller.other, 20 + 3 + 9, "the sums stay exact");
        // A rollup keeps them all, and reads back the same.
        let mut again = MergedSenders::default();
        again.add_stored(&senders.into_stored()).unwrap();
        assert_eq!(again.into_top(), top);
    }

    #[test]
    fn the_slowest_exemplars_are_kept_once_each() {
        let mut senders = MergedSenders::default();
        for (id, ns) in [('1', 10), ('2', 50), ('3', 30), ('2', 50), ('4', 70), ('5', 20), ('6', 60), ('7', 5)] {
            senders.add(vec![], vec![], Some(exemplar(id, ns)));
        }
        let mut rolled = MergedSenders::default();
        rolled.add_stored(&senders.clone().into_stored()).unwrap();
        assert_eq!(rolled, senders, "a rollup bucket keeps them all");
        let kept: Vec<u64> = senders.into_top().exemplars.iter().map(|e| e.duration_ns).collect();
        assert_eq!(kept, [70, 60, 50, 30, 20]);
        // A raw row's column: a DigestStats with one exemplar.
        let raw = sqlbee_proto::v1::DigestStats { exemplar: Some(exemplar('9', 3)), ..Default::default() };
        let mut read = MergedSenders::default();
        read.add_stored(&crate::store::blob::encode_senders(&raw)).unwrap();
        assert_eq!(read.into_top().exemplars, [exemplar('9', 3)]);
        assert!(MergedSenders::default().add_stored(b"\xff\xff").is_err(), "a corrupt column is an error");
    }
}
