//! A digest row's query tags and trace exemplar: bounded as the agent
//! bounds them, counts within the row's, ids in the W3C form.
use std::collections::HashSet;

use sqlbee_proto::v1::{TagCount, TraceExemplar};

use super::{Invalid, invalid, path::Path};

/// Keys per row (the agent's --query-tags takes at most 16).
pub const MAX_TAG_KEYS: usize = 16;
/// Values per key (the agent keeps at most 32).
pub const MAX_TAG_VALUES: usize = 64;
/// A key (the agent keeps at most 64 bytes).
pub const MAX_TAG_KEY: usize = 64;
/// A value (the agent keeps at most 128 bytes).
pub const MAX_TAG_VALUE: usize = 256;

pub(super) fn tags(at: &Path<'_>, tags: &[TagCount], count: u64) -> Result<(), Invalid> {
    if tags.len() > MAX_TAG_KEYS {
        return Err(invalid(at, format!("{} keys, at most {MAX_TAG_KEYS}", tags.len())));
    }
    let mut keys = HashSet::new();
    for (i, tag) in tags.iter().enumerate() {
        let at = at.index(i);
        let key_ok = !tag.key.is_empty()
            && tag.key.len() <= MAX_TAG_KEY
            && tag.key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !key_ok {
            return Err(invalid(
                at.field("key"),
                format!("{:?} is not a tag key: letters, digits, `_`, `-`, `.`, 1..={MAX_TAG_KEY} bytes", tag.key),
            ));
        }
        if !keys.insert(tag.key.as_str()) {
            return Err(invalid(at.field("key"), format!("{:?} listed twice", tag.key)));
        }
        if tag.values.len() > MAX_TAG_VALUES {
            return Err(invalid(at.field("values"), format!("{} values, at most {MAX_TAG_VALUES}", tag.values.len())));
        }
        let mut values = HashSet::new();
        let mut sum = tag.other;
        for (j, v) in tag.values.iter().enumerate() {
            let at = at.field("values");
            let at = at.index(j);
            if v.value.len() > MAX_TAG_VALUE {
                return Err(invalid(at.field("value"), format!("{} bytes, at most {MAX_TAG_VALUE}", v.value.len())));
            }
            if !values.insert(v.value.as_str()) {
                return Err(invalid(at.field("value"), "listed twice"));
            }
            sum = sum.saturating_add(v.count);
        }
        if sum > count {
            return Err(invalid(at, format!("counts and other sum to {sum}, above count {count}")));
        }
    }
    Ok(())
}

pub(super) fn exemplar(at: &Path<'_>, exemplar: Option<&TraceExemplar>, max_ns: u64) -> Result<(), Invalid> {
    let Some(e) = exemplar else { return Ok(()) };
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && s.bytes().any(|b| b != b'0')
    };
    if !hex(&e.trace_id, 32) {
        return Err(invalid(at.field("trace_id"), "not 32 lower-case hex digits (not all zero)"));
    }
    if !hex(&e.span_id, 16) {
        return Err(invalid(at.field("span_id"), "not 16 lower-case hex digits (not all zero)"));
    }
    if e.duration_ns > max_ns {
        return Err(invalid(at.field("duration_ns"), format!("{} is above max_ns {max_ns}", e.duration_ns)));
    }
    Ok(())
}
