//! Compact BLOB encoding of (key, count) pairs with strictly increasing
//! keys: histogram buckets and error codes. Each pair is two LEB128
//! varints, the key as the gap from the previous key. A typical histogram
//! of 10-20 buckets takes 20-40 bytes instead of 496 counters.
//!
//! Wait stats (`encode_waits`) are packed the same way, one entry after the
//! other: class length, class bytes (UTF-8), sum_ns, max_ns, statements.
//!
//! Two more stored encodings every backend shares: a digest's accounts,
//! clients, query tags and exemplar (an encoded `DigestStats` holding only them) and a lock wait's blockers
//! (a JSON array).

/// A digest's accounts, clients, query tags and exemplar as stored: a
/// `DigestStats` holding only them, empty for none (`senders`).
pub fn encode_senders(d: &sqlbee_proto::v1::DigestStats) -> Vec<u8> {
    let mut out = Vec::with_capacity(senders_len(d));
    encode_senders_into(d, &mut out);
    out
}

/// `DigestStats`' field numbers of the four: a message of those fields
/// alone is their entries one after the other.
const ACCOUNTS_FIELD: u32 = 16;
const TAGS_FIELD: u32 = 25;
const EXEMPLAR_FIELD: u32 = 26;
const CLIENTS_FIELD: u32 = 27;

/// The length of `encode_senders(d)`.
pub fn senders_len(d: &sqlbee_proto::v1::DigestStats) -> usize {
    use prost::encoding::message;
    message::encoded_len_repeated(ACCOUNTS_FIELD, &d.accounts)
        + message::encoded_len_repeated(TAGS_FIELD, &d.tags)
        + d.exemplar.as_ref().map_or(0, |e| message::encoded_len(EXEMPLAR_FIELD, e))
        + message::encoded_len_repeated(CLIENTS_FIELD, &d.clients)
}

/// `encode_senders` appended to `out`, without copying the row into a
/// message first (the collector writes one per digest row).
pub fn encode_senders_into(d: &sqlbee_proto::v1::DigestStats, out: &mut Vec<u8>) {
    use prost::encoding::message;
    for account in &d.accounts {
        message::encode(ACCOUNTS_FIELD, account, out);
    }
    for tag in &d.tags {
        message::encode(TAGS_FIELD, tag, out);
    }
    if let Some(e) = &d.exemplar {
        message::encode(EXEMPLAR_FIELD, e, out);
    }
    for client in &d.clients {
        message::encode(CLIENTS_FIELD, client, out);
    }
}

/// Blockers as stored: a JSON array, u64 ids exact (JSON numbers, not i64).
pub fn encode_blockers(blockers: &[sqlbee_proto::v1::Blocker]) -> String {
    serde_json::Value::Array(
        blockers
            .iter()
            .map(|b| {
                serde_json::json!({
                    "connection_id": b.connection_id,
                    "transaction": b.transaction,
                    "started_unix_ms": b.started_unix_ms,
                    "statements": b.statements,
                })
            })
            .collect(),
    )
    .to_string()
}

/// Reads back what `encode_blockers` wrote; None when it is not that.
pub fn decode_blockers(text: &str) -> Option<Vec<sqlbee_proto::v1::Blocker>> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value
        .as_array()?
        .iter()
        .map(|b| {
            Some(sqlbee_proto::v1::Blocker {
                connection_id: b.get("connection_id")?.as_u64()?,
                transaction: b.get("transaction")?.as_bool()?,
                started_unix_ms: b.get("started_unix_ms")?.as_i64()?,
                statements: b
                    .get("statements")?
                    .as_array()?
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()?,
            })
        })
        .collect()
}

pub fn encode(pairs: impl IntoIterator<Item = (u64, u64)>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous = 0u64;
    for (key, count) in pairs {
        varint(&mut out, key.wrapping_sub(previous));
        varint(&mut out, count);
        previous = key;
    }
    out
}

/// Decodes what `encode` wrote; None when the bytes are not such a list.
pub fn decode(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    decode_with(bytes, u64::checked_add)
}

/// As `decode`, but also reads back keys that were not increasing (the gap
/// wrapped around): version-1 stores wrote error codes in the order the
/// agent sent them.
pub fn decode_any_order(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    decode_with(bytes, |previous, gap| Some(previous.wrapping_add(gap)))
}

fn decode_with(mut bytes: &[u8], next: impl Fn(u64, u64) -> Option<u64>) -> Option<Vec<(u64, u64)>> {
    let mut pairs = Vec::new();
    let mut previous = 0u64;
    while !bytes.is_empty() {
        let gap = read_varint(&mut bytes)?;
        let count = read_varint(&mut bytes)?;
        previous = next(previous, gap)?;
        pairs.push((previous, count));
    }
    Some(pairs)
}

/// One wait class of one digest window: (class, sum_ns, max_ns, statements).
pub type Wait = (String, u64, u64, u64);

pub fn encode_waits<'a>(waits: impl IntoIterator<Item = (&'a str, u64, u64, u64)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (class, sum_ns, max_ns, statements) in waits {
        varint(&mut out, class.len() as u64);
        out.extend_from_slice(class.as_bytes());
        varint(&mut out, sum_ns);
        varint(&mut out, max_ns);
        varint(&mut out, statements);
    }
    out
}

/// Decodes what `encode_waits` wrote; None when the bytes are not such a list.
pub fn decode_waits(mut bytes: &[u8]) -> Option<Vec<Wait>> {
    let mut waits = Vec::new();
    while !bytes.is_empty() {
        let len = usize::try_from(read_varint(&mut bytes)?).ok()?;
        if len > bytes.len() {
            return None;
        }
        let (class, rest) = bytes.split_at(len);
        bytes = rest;
        let class = std::str::from_utf8(class).ok()?.to_string();
        let sum_ns = read_varint(&mut bytes)?;
        let max_ns = read_varint(&mut bytes)?;
        let statements = read_varint(&mut bytes)?;
        waits.push((class, sum_ns, max_ns, statements));
    }
    Some(waits)
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_are_a_digest_holding_only_them() {
        use prost::Message as _;
        use sqlbee_proto::v1::{AccountCount, DigestStats, TagCount, TagValue, TraceExemplar};
        let row = DigestStats {
            accounts: vec![
                AccountCount { user: "app".into(), host: "10.0.0.7".into(), count: 300 },
                AccountCount { user: String::new(), host: "h".into(), count: 0 },
                AccountCount { user: "report".into(), host: String::new(), count: u64::MAX },
            ],
            tags: vec![TagCount {
                key: "controller".into(),
                values: vec![TagValue { value: "orders".into(), count: 7 }],
                other: 2,
            }],
            exemplar: Some(TraceExemplar { trace_id: "a".repeat(32), span_id: "b".repeat(16), duration_ns: 9 }),
            digest_text: "not stored here".into(),
            count: 400,
            ..Default::default()
        };
        let bytes = encode_senders(&row);
        assert_eq!(bytes.len(), senders_len(&row));
        let back = DigestStats::decode(bytes.as_slice()).unwrap();
        assert_eq!((back.accounts, back.tags, back.exemplar), (row.accounts, row.tags, row.exemplar));
        assert!(back.digest_text.is_empty() && back.count == 0);
        assert!(encode_senders(&DigestStats::default()).is_empty());
    }

    #[test]
    fn round_trip() {
        let pairs = vec![(0, 1), (3, 127), (40, 128), (495, u64::MAX), (u64::MAX, 0)];
        assert_eq!(decode(&encode(pairs.clone())).unwrap(), pairs);
        assert_eq!(decode(&encode([])).unwrap(), vec![]);
        assert_eq!(encode([(40, 1), (41, 2)]).len(), 4);
        let unordered = vec![(1213, 1), (1062, 2), (1213, 3)];
        assert!(decode(&encode(unordered.clone())).is_none());
        assert_eq!(decode_any_order(&encode(unordered.clone())).unwrap(), unordered);
    }

    #[test]
    fn refuses_garbage() {
        assert!(decode(&[0x80]).is_none());
        assert!(decode(&[1]).is_none());
        assert!(decode(&[0xff; 11]).is_none());
    }

    #[test]
    fn waits_round_trip() {
        let waits = [("row_lock", 512_000_000, u64::MAX, 3), ("", 0, 0, 0), ("disk_io", 1, 1, 1)];
        let bytes = encode_waits(waits);
        let decoded = decode_waits(&bytes).unwrap();
        let expected: Vec<Wait> = waits.iter().map(|&(c, s, m, n)| (c.to_string(), s, m, n)).collect();
        assert_eq!(decoded, expected);
        assert_eq!(decode_waits(&[]).unwrap(), vec![]);
        // Cut anywhere, the bytes are refused rather than misread.
        let boundaries: Vec<usize> = (1..waits.len()).map(|k| encode_waits(waits[..k].iter().copied()).len()).collect();
        for cut in 1..bytes.len() {
            assert_eq!(decode_waits(&bytes[..cut]).is_some(), boundaries.contains(&cut), "cut {cut}");
        }
        assert!(decode_waits(&[5, b'a']).is_none());
        assert!(decode_waits(&[2, 0xff, 0xfe, 0, 0, 0]).is_none());
    }
}
