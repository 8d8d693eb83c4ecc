//! A prepared statement's values: the value probes' records (see the
//! kernel's `values`) decoded into SQL literals and paired with the
//! statement they were executed with. They exist for one reason, EXPLAIN,
//! and live in the agent's memory only (see `aggregate::RawSample`).
//!
//! Pairing needs no identifier: a thread decodes a statement's values
//! before that statement ends, and the kernel sends that statement's end
//! as a record, so a thread's values up to a record's end are that
//! record's. The value ring is drained after the statement ring, so every
//! value of a drained record is drained with it.
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use sqlbee_kernel_abi::{ValueEvent, command};

use super::Statement;
use crate::discover::ValueType;

/// Values kept while their statement's record has not come, at most.
const MAX_PENDING: usize = 10_000;
/// A value older than this never found its record (its statement ended
/// while the agent was not listening): dropped.
const STALE_NS: u64 = 30_000_000_000;

/// A statement's values as SQL literals, in the order of its placeholders.
/// Its `Debug` shows how many, never what.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BoundValues(pub Arc<[String]>);

impl std::fmt::Debug for BoundValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BoundValues({} values)", self.0.len())
    }
}

/// One decoded value; None when it cannot be written back as a literal
/// (cut at the copy limit, a decoder not known, bytes that do not parse).
struct Pending {
    at_ns: u64,
    literal: Option<String>,
}

/// One server's values waiting for their statements.
#[derive(Default)]
pub struct Values {
    /// Each value decoder's address in the process, and its type.
    decoders: HashMap<u64, ValueType>,
    pending: HashMap<u32, VecDeque<Pending>>,
    held: usize,
    /// Records that could not be read.
    pub bad: u64,
    /// Values taken in so far.
    pub learned: u64,
}

impl Values {
    pub fn new(decoders: HashMap<u64, ValueType>) -> Values {
        Values { decoders, ..Values::default() }
    }

    /// Takes one value record in.
    pub fn learn(&mut self, record: &[u8]) {
        if record.len() < std::mem::size_of::<ValueEvent>() {
            self.bad += 1;
            return;
        }
        // SAFETY: length checked; plain integers and bytes.
        let event: ValueEvent = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
        self.learned += 1;
        let captured = &event.bytes[..(event.captured as usize).min(event.bytes.len())];
        let decoder = self.decoders.get(&event.ip);
        if decoder.is_none() {
            tracing::debug!(ip = event.ip, known = ?self.decoders, "a value from an unknown decoder");
        }
        let literal = decoder.and_then(|t| literal(*t, captured));
        if self.held >= MAX_PENDING {
            self.pending.clear();
            self.held = 0;
        }
        self.pending.entry(event.tid).or_default().push_back(Pending { at_ns: event.at_ns, literal });
        self.held += 1;
    }

    /// Gives each executed prepared statement in `statements` the values
    /// its thread decoded before it ended; forgets values that waited too
    /// long.
    pub fn pair(&mut self, statements: &mut [Statement]) {
        if self.held == 0 {
            return;
        }
        let mut newest = 0;
        for statement in statements.iter_mut().filter(|s| !s.nested) {
            let end = statement.start_ns.saturating_add(statement.duration_ns);
            newest = newest.max(end);
            let Some(queue) = self.pending.get_mut(&statement.tid) else { continue };
            let mut literals = Vec::new();
            let mut whole = true;
            while queue.front().is_some_and(|v| v.at_ns <= end) {
                let value = queue.pop_front().expect("checked above");
                self.held -= 1;
                match value.literal {
                    Some(literal) => literals.push(literal),
                    None => whole = false,
                }
            }
            if statement.command == command::STMT_EXECUTE && whole && !literals.is_empty() {
                statement.values = Some(BoundValues(literals.into()));
            }
        }
        let cutoff = newest.saturating_sub(STALE_NS);
        for queue in self.pending.values_mut() {
            while queue.front().is_some_and(|v| v.at_ns < cutoff) {
                queue.pop_front();
                self.held -= 1;
            }
        }
        self.pending.retain(|_, queue| !queue.is_empty());
    }
}

/// The value as a literal the server reads back as the same value.
fn literal(value_type: ValueType, bytes: &[u8]) -> Option<String> {
    let fixed = |n: usize| bytes.get(..n);
    Some(match value_type {
        ValueType::Null => "NULL".into(),
        // Signed: the decoder's unsigned flag is the client's, not on the
        // wire with every value; a plan does not turn on the sign.
        ValueType::Tiny => (fixed(1)?[0] as i8).to_string(),
        ValueType::Short => i16::from_le_bytes(fixed(2)?.try_into().ok()?).to_string(),
        ValueType::Int32 => i32::from_le_bytes(fixed(4)?.try_into().ok()?).to_string(),
        ValueType::Int64 => i64::from_le_bytes(fixed(8)?.try_into().ok()?).to_string(),
        ValueType::Float => real(f32::from_le_bytes(fixed(4)?.try_into().ok()?) as f64)?,
        ValueType::Double => real(f64::from_le_bytes(fixed(8)?.try_into().ok()?))?,
        ValueType::Decimal => {
            let text = std::str::from_utf8(length_prefixed(bytes)?).ok()?;
            let numeric = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            numeric.then(|| text.to_string())?
        }
        ValueType::Str => string(length_prefixed(bytes)?),
        ValueType::Date => {
            let fields = length_prefixed(bytes)?;
            let (y, m, d) = date_of(fields)?;
            format!("'{y:04}-{m:02}-{d:02}'")
        }
        ValueType::DateTime => {
            let fields = length_prefixed(bytes)?;
            let (y, m, d) = date_of(fields)?;
            let (h, mi, s) = if fields.len() >= 7 { (fields[4], fields[5], fields[6]) } else { (0, 0, 0) };
            format!("'{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}{}'", micros(fields, 7))
        }
        ValueType::Time => {
            let fields = length_prefixed(bytes)?;
            if fields.is_empty() {
                return Some("'00:00:00'".into());
            }
            if fields.len() < 8 {
                return None;
            }
            let sign = if fields[0] != 0 { "-" } else { "" };
            let days = u32::from_le_bytes(fields[1..5].try_into().ok()?) as u64;
            let hours = days * 24 + fields[5] as u64;
            format!("'{sign}{hours:02}:{:02}:{:02}{}'", fields[6], fields[7], micros(fields, 8))
        }
    })
}

/// A float as a literal of type DOUBLE (`1.5e0`), as the server received it.
fn real(value: f64) -> Option<String> {
    value.is_finite().then(|| format!("{value:e}"))
}

/// A string literal: quoted when it is plain text, else in hex. A
/// backslash goes in hex too: what it means in quotes depends on the
/// session's `NO_BACKSLASH_ESCAPES`.
fn string(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.contains(['\\', '\0']) => format!("'{}'", text.replace('\'', "''")),
        _ => format!("X'{}'", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

/// Year, month and day of a binary date or datetime (all zero when the
/// client sent none).
fn date_of(fields: &[u8]) -> Option<(u16, u8, u8)> {
    match fields.len() {
        0 => Some((0, 0, 0)),
        n if n >= 4 => Some((u16::from_le_bytes([fields[0], fields[1]]), fields[2], fields[3])),
        _ => None,
    }
}

/// `.ffffff` when the fields carry microseconds at `at`.
fn micros(fields: &[u8], at: usize) -> String {
    match fields.get(at..at + 4) {
        Some(bytes) => match u32::from_le_bytes(bytes.try_into().expect("four bytes")) {
            0 => String::new(),
            us => format!(".{us:06}"),
        },
        None => String::new(),
    }
}

/// The bytes after a length-encoded length, when all of them were copied.
fn length_prefixed(bytes: &[u8]) -> Option<&[u8]> {
    let (&first, rest) = bytes.split_first()?;
    let (len, rest) = match first {
        0..=250 => (first as usize, rest),
        252 => (u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize, &rest[2..]),
        253 => {
            let b = rest.get(..3)?;
            (u32::from_le_bytes([b[0], b[1], b[2], 0]) as usize, &rest[3..])
        }
        254 => (u64::from_le_bytes(rest.get(..8)?.try_into().ok()?) as usize, &rest[8..]),
        _ => return None,
    };
    rest.get(..len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tid: u32, ip: u64, at_ns: u64, bytes: &[u8]) -> Vec<u8> {
        let mut event = ValueEvent {
            tid,
            captured: bytes.len() as u32,
            ip,
            at_ns,
            available: bytes.len() as u64,
            bytes: [0; sqlbee_kernel_abi::VALUE_BYTES],
        };
        event.bytes[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: a plain struct viewed as its bytes.
        unsafe { std::slice::from_raw_parts((&event as *const ValueEvent).cast::<u8>(), size_of::<ValueEvent>()) }
            .to_vec()
    }

    fn execute(tid: u32, start_ns: u64, end_ns: u64) -> Statement {
        Statement {
            tid,
            start_ns,
            duration_ns: end_ns - start_ns,
            command: command::STMT_EXECUTE,
            ..Statement::default()
        }
    }

    #[test]
    fn each_wire_type_becomes_a_literal_of_its_value() {
        assert_eq!(literal(ValueType::Tiny, &[0xff]).as_deref(), Some("-1"));
        assert_eq!(literal(ValueType::Short, &300i16.to_le_bytes()).as_deref(), Some("300"));
        assert_eq!(literal(ValueType::Int32, &(-70000i32).to_le_bytes()).as_deref(), Some("-70000"));
        assert_eq!(literal(ValueType::Int64, &(1i64 << 40).to_le_bytes()).as_deref(), Some("1099511627776"));
        assert_eq!(literal(ValueType::Double, &2.5f64.to_le_bytes()).as_deref(), Some("2.5e0"));
        assert_eq!(literal(ValueType::Float, &0.5f32.to_le_bytes()).as_deref(), Some("5e-1"));
        assert_eq!(literal(ValueType::Double, &f64::NAN.to_le_bytes()), None);
        assert_eq!(literal(ValueType::Decimal, b"\x0612.500").as_deref(), Some("12.500"));
        assert_eq!(literal(ValueType::Decimal, b"\x031;2"), None);
        assert_eq!(literal(ValueType::Str, b"\x04it's").as_deref(), Some("'it''s'"));
        assert_eq!(literal(ValueType::Str, b"\x03a\\b").as_deref(), Some("X'615c62'"));
        assert_eq!(literal(ValueType::Str, b"\x02\xff\xfe").as_deref(), Some("X'fffe'"));
        assert_eq!(literal(ValueType::Null, b"").as_deref(), Some("NULL"));
        let mut long = vec![252, 0x2c, 0x01];
        long.extend(std::iter::repeat_n(b'a', 300));
        assert_eq!(literal(ValueType::Str, &long).map(|l| l.len()), Some(302));
        // Cut at the copy limit: no literal rather than a wrong one.
        assert_eq!(literal(ValueType::Str, &long[..256]), None);
        assert_eq!(literal(ValueType::Date, &[4, 0xea, 0x07, 11, 29]).as_deref(), Some("'2026-11-29'"));
        assert_eq!(
            literal(ValueType::DateTime, &[11, 0xea, 0x07, 11, 29, 7, 5, 9, 0x40, 0xe2, 0x01, 0]).as_deref(),
            Some("'2026-11-29 07:05:09.123456'")
        );
        assert_eq!(literal(ValueType::DateTime, &[0]).as_deref(), Some("'0000-00-00 00:00:00'"));
        assert_eq!(literal(ValueType::Time, &[8, 1, 1, 0, 0, 0, 2, 3, 4]).as_deref(), Some("'-26:03:04'"));
    }

    #[test]
    fn values_go_to_the_statement_their_thread_ended_next() {
        const INT: u64 = 0x1000;
        const STR: u64 = 0x2000;
        let mut values = Values::new(HashMap::from([(INT, ValueType::Int32), (STR, ValueType::Str)]));
        values.learn(&event(7, INT, 100, &5i32.to_le_bytes()));
        values.learn(&event(8, STR, 105, b"\x01x"));
        values.learn(&event(7, STR, 110, b"\x02ab"));
        values.learn(&event(7, INT, 300, &9i32.to_le_bytes()));
        let mut statements = vec![execute(7, 90, 200), execute(8, 100, 250), execute(7, 290, 400)];
        values.pair(&mut statements);
        let bound: Vec<Option<Vec<String>>> =
            statements.iter().map(|s| s.values.as_ref().map(|v| v.0.to_vec())).collect();
        assert_eq!(bound, [Some(vec!["5".into(), "'ab'".into()]), Some(vec!["'x'".into()]), Some(vec!["9".into()])]);
        assert_eq!(values.held, 0);
    }

    #[test]
    fn a_statement_with_a_value_it_cannot_write_back_is_not_bound() {
        let mut values = Values::new(HashMap::from([(1, ValueType::Int32)]));
        values.learn(&event(3, 1, 10, &1i32.to_le_bytes()));
        values.learn(&event(3, 99, 11, &[1]));
        let mut statements = vec![execute(3, 5, 20)];
        values.pair(&mut statements);
        assert_eq!(statements[0].values, None);
        // Consumed all the same: the next statement does not take them.
        assert_eq!(values.held, 0);
    }

    #[test]
    fn values_whose_record_never_comes_are_forgotten() {
        let mut values = Values::new(HashMap::from([(1, ValueType::Int32)]));
        values.learn(&event(3, 1, 10, &1i32.to_le_bytes()));
        let mut statements = vec![execute(4, STALE_NS + 100, STALE_NS + 200)];
        values.pair(&mut statements);
        assert_eq!(values.held, 0);
        assert!(values.pending.is_empty());
    }
}
