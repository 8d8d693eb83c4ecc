//! Bounds on what decoding a message may cost, checked on the received
//! bytes before prost decodes them. prost turns every element of a
//! repeated field into a struct of a few hundred bytes, so a few bytes on
//! the wire can become a large allocation: 16 million empty digest rows
//! are 32 MB of protobuf, and several GiB decoded. The scan walks the wire
//! format with each message's schema (generated from the .proto files by
//! build.rs), counts the elements of each repeated field, measures each
//! string, and adds up an estimate of the decoded size; it allocates
//! nothing. A message past a limit is refused, naming the field
//! (`windows[2].digests`), before anything is decoded.
use std::fmt;

/// A message type's fields that cost memory when decoded.
pub struct Schema {
    pub name: &'static str,
    /// `size_of` the decoded struct.
    pub size: usize,
    /// By tag: 1 + the field's position in `fields`, or 0 for a field the
    /// scan passes over (a number).
    pub by_tag: &'static [u8],
    /// Fields that hold messages, strings or repeated numbers: what costs
    /// memory beyond the struct. A message with none is passed over whole.
    pub fields: &'static [Field],
}

pub struct Field {
    pub tag: u32,
    pub name: &'static str,
    pub kind: Kind,
    pub repeated: bool,
    /// A repeated field's counter among its message's (`u8::MAX` if not
    /// repeated).
    pub slot: u8,
    /// Elements of a repeated field per message holding it.
    pub max_count: Option<u64>,
    /// Bytes of a string or bytes field.
    pub max_len: Option<u64>,
}

pub enum Kind {
    Message(&'static Schema),
    /// `string` or `bytes`.
    Text,
    /// A repeated number: packed, or one element per occurrence; `width`
    /// bytes each, or 0 for a varint.
    RepeatedNumber {
        width: u8,
    },
}

/// A message type the scan knows (every sqlbee.v1 message implements it).
pub trait Bounded {
    const SCHEMA: &'static Schema;
    /// The decoded-size estimate past which the message is refused.
    const MAX_DECODED: u64;
}

include!(concat!(env!("OUT_DIR"), "/bounds.rs"));

/// Why a message was refused; `path` names the field as the collector's
/// validation does (`windows[2].digests`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBounds {
    pub path: String,
    pub problem: String,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() { write!(f, "{}", self.problem) } else { write!(f, "{}: {}", self.path, self.problem) }
    }
}

impl std::error::Error for OutOfBounds {}

/// Checks `bytes`, the encoding of one `M`, against `M`'s bounds.
pub fn check<M: Bounded>(bytes: &[u8]) -> Result<(), OutOfBounds> {
    let mut scan = Scan { used: M::SCHEMA.size as u64, budget: M::MAX_DECODED, path: Vec::new() };
    scan.message(bytes, M::SCHEMA)
}

/// Decoded bytes one received byte can become at most: an element of a
/// repeated message field takes 2 bytes on the wire (its tag and a zero
/// length) and its struct, twice over in a grown vector, decoded; a
/// string's byte is one byte.
fn amplification() -> u64 {
    static MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| ALL.iter().map(|s| s.size as u64 * VEC_SLACK / 2).max().unwrap_or(1).max(1))
}

/// Checks the message before it is decoded when it is large enough that
/// decoding it could pass `M`'s decoded-size bound; a smaller one cannot,
/// whatever it holds, and is not walked twice. Either way the collector's
/// validation checks every limit on the decoded message.
pub fn check_if_large<M: Bounded>(bytes: &[u8]) -> Result<(), OutOfBounds> {
    if (bytes.len() as u64).saturating_mul(amplification()) <= M::MAX_DECODED {
        return Ok(());
    }
    check::<M>(bytes)
}

/// Repeated fields a message may have (build.rs checks it).
const MAX_SLOTS: usize = 8;
/// Elements a field holds before its element's size counts twice: a
/// vector grown by doubling holds up to twice what it needs.
const VEC_SLACK: u64 = 2;

struct Scan {
    used: u64,
    budget: u64,
    /// (field, element) from the root to the message being scanned.
    path: Vec<(&'static str, Option<u64>)>,
}

impl Scan {
    fn fail(&self, field: Option<(&'static str, Option<u64>)>, problem: String) -> OutOfBounds {
        let mut path = String::new();
        for (name, index) in self.path.iter().copied().chain(field) {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
            if let Some(i) = index {
                path.push_str(&format!("[{i}]"));
            }
        }
        OutOfBounds { path, problem }
    }

    fn charge(&mut self, bytes: u64, field: &'static str) -> Result<(), OutOfBounds> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.budget {
            return Err(self.fail(
                Some((field, None)),
                format!(
                    "decoded, the message would take more than {} MiB (an estimate from its sizes and counts); \
                     send fewer or smaller rows per message",
                    self.budget >> 20
                ),
            ));
        }
        Ok(())
    }

    fn message(&mut self, bytes: &[u8], schema: &'static Schema) -> Result<(), OutOfBounds> {
        let mut counts = [0u64; MAX_SLOTS];
        let mut at = 0usize;
        while at < bytes.len() {
            let key = self.varint(bytes, &mut at)?;
            let (tag, wire) = ((key >> 3) as u32, key & 7);
            let found = match schema.by_tag.get(tag as usize) {
                Some(&at) if at > 0 => Some(at as usize - 1),
                _ => None,
            };
            let length = match wire {
                0 => {
                    self.varint(bytes, &mut at)?;
                    None
                }
                1 => Some(8),
                5 => Some(4),
                2 => Some(self.varint(bytes, &mut at)?),
                _ => {
                    return Err(self.fail(
                        None,
                        format!("field {tag} of {} has wire type {wire}, which sqlbee.v1 never sends", schema.name),
                    ));
                }
            };
            let payload = match length {
                None => &[][..],
                Some(len) => {
                    let end = at.checked_add(len as usize).filter(|&end| end <= bytes.len()).ok_or_else(|| {
                        self.fail(None, format!("field {tag} of {} runs past the end of the message", schema.name))
                    })?;
                    let payload = &bytes[at..end];
                    at = end;
                    payload
                }
            };
            let Some(i) = found else { continue };
            let field = &schema.fields[i];
            // Elements this occurrence adds: a packed run holds several.
            let elements = match field.kind {
                Kind::RepeatedNumber { width } if wire == 2 => packed_elements(payload, width),
                _ => 1,
            };
            let count = match counts.get_mut(field.slot as usize) {
                Some(count) => {
                    *count = count.saturating_add(elements);
                    *count
                }
                None => 1,
            };
            if let Some(max) = field.max_count
                && count > max
            {
                return Err(self.fail(
                    Some((field.name, None)),
                    format!("more than {max} elements; at most {max} per {}", schema.name),
                ));
            }
            let slack = if field.repeated { VEC_SLACK } else { 1 };
            match field.kind {
                Kind::Message(sub) => {
                    if wire != 2 {
                        return Err(self.fail(Some((field.name, None)), "a message field not sent as one".to_string()));
                    }
                    self.charge(sub.size as u64 * slack, field.name)?;
                    // A message of numbers only costs its struct, charged
                    // above: its bytes need no walk.
                    if !sub.fields.is_empty() {
                        self.path.push((field.name, field.repeated.then(|| count - 1)));
                        self.message(payload, sub)?;
                        self.path.pop();
                    }
                }
                Kind::Text => {
                    if let Some(max) = field.max_len
                        && payload.len() as u64 > max
                    {
                        let index = field.repeated.then(|| count - 1);
                        return Err(
                            self.fail(Some((field.name, index)), format!("{} bytes, at most {max}", payload.len()))
                        );
                    }
                    let header = if field.repeated { std::mem::size_of::<String>() as u64 * slack } else { 0 };
                    self.charge(payload.len() as u64 + header, field.name)?;
                }
                Kind::RepeatedNumber { .. } => self.charge(elements * 8 * slack, field.name)?,
            }
        }
        Ok(())
    }

    fn varint(&self, bytes: &[u8], at: &mut usize) -> Result<u64, OutOfBounds> {
        let mut value = 0u64;
        for shift in 0..10 {
            let Some(&byte) = bytes.get(*at) else {
                return Err(self.fail(None, "a number runs past the end of the message".to_string()));
            };
            *at += 1;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail(None, "a number longer than 10 bytes".to_string()))
    }
}

/// Elements of a packed run: its bytes over the width, or its varints.
fn packed_elements(payload: &[u8], width: u8) -> u64 {
    match width {
        0 => payload.iter().filter(|b| **b & 0x80 == 0).count() as u64,
        width => payload.len().div_ceil(width as usize) as u64,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::v1::{Batch, DigestStats, Histogram, InstanceWindow, SeriesRequest, ServerInstance};

    fn window(digests: usize) -> InstanceWindow {
        InstanceWindow {
            instance: Some(ServerInstance { name: "db:3306".into(), ..Default::default() }),
            digests: (0..digests)
                .map(|i| DigestStats {
                    digest: i as u64,
                    digest_text: "SELECT ?".into(),
                    count: 1,
                    histogram: Some(Histogram { scheme: 1, buckets: vec![Default::default(); 3] }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_the_agent_sends_passes() {
        let batch = Batch { sequence: 1, windows: vec![window(5_000), window(10)], ..Default::default() };
        assert_eq!(check::<Batch>(&batch.encode_to_vec()), Ok(()));
    }

    #[test]
    fn too_many_elements_are_refused_naming_the_field() {
        let batch = Batch { sequence: 1, windows: vec![window(1), window(50_002)], ..Default::default() };
        let refused = check::<Batch>(&batch.encode_to_vec()).unwrap_err();
        assert_eq!(refused.path, "windows[1].digests");
        assert_eq!(refused.problem, "more than 50001 elements; at most 50001 per InstanceWindow");
    }

    #[test]
    fn empty_rows_by_the_million_are_refused_by_their_decoded_size() {
        // 300,000 empty rows spread over windows, each under its count limit.
        let mut bytes = Vec::new();
        for _ in 0..10 {
            let w = InstanceWindow { digests: vec![DigestStats::default(); 30_000], ..Default::default() };
            Batch { windows: vec![w], ..Default::default() }.encode(&mut bytes).unwrap();
        }
        assert!(bytes.len() < 1 << 20, "a small message: {} bytes", bytes.len());
        let refused = check::<Batch>(&bytes).unwrap_err();
        assert!(refused.problem.contains("MiB"), "{refused}");
    }

    #[test]
    fn a_long_string_is_refused_with_its_length() {
        let mut w = window(2);
        w.digests[1].sample = "x".repeat(70_000);
        let refused = check::<Batch>(&Batch { windows: vec![w], ..Default::default() }.encode_to_vec()).unwrap_err();
        assert_eq!(refused.path, "windows[0].digests[1].sample");
        assert_eq!(refused.problem, "70000 bytes, at most 65536");
    }

    #[test]
    fn packed_numbers_are_counted() {
        let ok = SeriesRequest { by_digests: vec![7; 1_000], ..Default::default() };
        assert_eq!(check::<SeriesRequest>(&ok.encode_to_vec()), Ok(()));
        let refused = SeriesRequest { by_digests: vec![7; 1_001], ..Default::default() };
        assert_eq!(check::<SeriesRequest>(&refused.encode_to_vec()).unwrap_err().path, "by_digests");
    }

    #[test]
    fn malformed_bytes_are_refused_not_scanned_past() {
        assert!(check::<Batch>(&[0x22, 0xff, 0xff, 0x03]).is_err(), "a length past the end");
        assert!(check::<Batch>(&[0x23]).is_err(), "a group");
        assert!(check::<Batch>(&[0x80; 11]).is_err(), "a varint past 10 bytes");
    }

    #[test]
    fn a_small_message_cannot_pass_the_bound_and_is_not_walked() {
        let small = amplification();
        assert!(small >= SCHEMA_DIGEST_STATS.size as u64, "{small}");
        let under = (Batch::MAX_DECODED / small) as usize;
        // Empty rows, every one as costly as a row can be per byte, in
        // windows within their count limit.
        let mut rows = under / 2 - 1_000;
        let mut windows = Vec::new();
        while rows > 0 {
            let mut w = InstanceWindow::default();
            w.digests = vec![DigestStats::default(); rows.min(40_000)];
            rows -= w.digests.len();
            windows.push(w);
        }
        let bytes = Batch { windows, ..Default::default() }.encode_to_vec();
        assert!(bytes.len() <= under, "{} > {under}", bytes.len());
        assert_eq!(check_if_large::<Batch>(&bytes), Ok(()));
        assert_eq!(check::<Batch>(&bytes), Ok(()), "within the bound when walked too");
        let large = Batch { windows: vec![window(1); 20_000], ..Default::default() }.encode_to_vec();
        assert!(large.len() > under);
        assert!(check_if_large::<Batch>(&large).is_err(), "a large one is walked");
    }

    #[test]
    fn fields_are_found_by_tag() {
        for schema in [&SCHEMA_BATCH, &SCHEMA_DIGEST_STATS, &SCHEMA_TOP_DIGEST, &SCHEMA_INSTANCE_INFO] {
            for (i, field) in schema.fields.iter().enumerate() {
                assert_eq!(schema.by_tag[field.tag as usize] as usize, i + 1, "{}.{}", schema.name, field.name);
            }
        }
        assert!(SCHEMA_BUCKET.fields.is_empty(), "a message of numbers is passed over");
    }
}
