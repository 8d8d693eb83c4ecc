//! Ring-buffer record -> owned statement.
use std::sync::Arc;

use sqlbee_kernel_abi::{EVENT_HEADER_LEN, ErrorSample, FigureSums, StatementEvent, flags, wait_class};

use super::names::{Account, Program};
use crate::discover::Client;

/// One finished statement as the kernel saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Statement {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub thd: u64,
    pub connection_id: u64,
    pub tid: u32,
    pub command: u32,
    pub stmt_id: u32,
    pub error_code: u32,
    /// Length of the text in the server.
    pub text_len: u32,
    pub truncated: bool,
    /// The captured text: raw bytes, not necessarily UTF-8.
    pub text: Vec<u8>,
    /// Time waited per wait class (`sqlbee_kernel_abi::wait_class`), ns.
    pub waits: [u64; wait_class::COUNT],
    /// The server's own figures (rows, lock time, temporary tables, ...)
    /// and the thread's CPU time.
    pub stats: FigureSums,
    /// Hashes of the schema and account (0: none), and what they name when
    /// the probe stage knows (see `names`).
    pub schema_hash: u64,
    pub account_hash: u64,
    pub schema: Option<Arc<str>>,
    pub account: Option<Arc<Account>>,
    /// Who sent it, when the probe stage names clients and found this one.
    pub client: Option<Arc<Client>>,
    /// Run by a stored program (see `Program`): timed from its own start.
    pub nested: bool,
    /// `sqlbee_kernel_abi::source`: a client's, the replica applier's or the
    /// event scheduler's.
    pub source: u32,
    /// The program a nested statement ran in: its hash, kind and name.
    pub program_hash: u64,
    pub program_kind: u32,
    pub program: Option<Arc<Program>>,
    /// Start of the client statement whose program ran this one (0: none).
    pub parent_start_ns: u64,
    /// When the error was raised; names its message sample.
    pub error_ns: u64,
    /// The message the server sent with `error_code`, when sampled.
    pub error_message: Option<String>,
    /// Text hash of the kernel digests when later statements of this
    /// hash come as kernel digests; 0 otherwise.
    pub text_hash: u64,
    /// Counted in a kernel digest already: only a sample of its text.
    pub sample: bool,
    /// Sent without its text because the agent is shedding load.
    pub shed: bool,
    /// The values an executed prepared statement ran with, when the value
    /// probes were attached (for plans; see `values`).
    pub values: Option<super::values::BoundValues>,
}

/// An error message the server sent, for attaching to its statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMessage {
    pub tid: u32,
    pub raised_ns: u64,
    pub code: u32,
    pub message: String,
}

pub fn decode_error(record: &[u8]) -> Option<ErrorMessage> {
    if record.len() < std::mem::size_of::<ErrorSample>() {
        return None;
    }
    // SAFETY: length checked; plain integers and bytes.
    let sample: ErrorSample = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
    let end = sample.message.iter().position(|b| *b == 0).unwrap_or(sample.message.len());
    Some(ErrorMessage {
        tid: sample.tid,
        raised_ns: sample.raised_ns,
        code: sample.code,
        message: String::from_utf8_lossy(&sample.message[..end]).into_owned(),
    })
}

/// Decodes one record; `None` for a record too short to be one of ours.
pub fn decode_statement(record: &[u8]) -> Option<Statement> {
    if record.len() < EVENT_HEADER_LEN {
        return None;
    }
    // SAFETY: length checked; the header is plain integers and the ring
    // buffer only guarantees 8-byte alignment, hence read_unaligned.
    let header: StatementEvent = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
    let body = &record[EVENT_HEADER_LEN..];
    let captured = (header.captured_len as usize).min(body.len());
    Some(Statement {
        start_ns: header.start_ns,
        duration_ns: header.duration_ns,
        thd: header.thd,
        connection_id: header.connection_id,
        tid: header.tid,
        command: header.command,
        stmt_id: header.stmt_id,
        error_code: header.error_code,
        text_len: header.text_len,
        truncated: header.flags & flags::TRUNCATED != 0,
        text: body[..captured].to_vec(),
        waits: header.waits,
        stats: {
            let mut sum = FigureSums::default();
            sum.add_statement(&header.stats);
            sum
        },
        schema_hash: header.schema_hash,
        account_hash: header.account_hash,
        schema: None,
        account: None,
        client: None,
        nested: header.flags & flags::NESTED != 0,
        source: header.source,
        program_hash: header.program_hash,
        program_kind: header.program_kind,
        program: None,
        parent_start_ns: header.parent_start_ns,
        error_ns: header.error_ns,
        error_message: None,
        text_hash: header.text_hash,
        sample: header.flags & flags::SAMPLE != 0,
        shed: header.flags & flags::SHED != 0,
        values: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_records_are_rejected_and_text_is_bounded() {
        assert!(decode_statement(&[0u8; 10]).is_none());
        let header = StatementEvent { captured_len: 100, text_len: 200, flags: flags::TRUNCATED, ..Default::default() };
        let mut record = vec![0u8; EVENT_HEADER_LEN];
        // SAFETY: the vector is exactly one header long.
        unsafe { std::ptr::write_unaligned(record.as_mut_ptr().cast(), header) };
        record.extend_from_slice(b"SELECT 1");
        let s = decode_statement(&record).unwrap();
        assert_eq!(s.text, b"SELECT 1");
        assert!(s.truncated);
        assert_eq!(s.text_len, 200);
    }
}
