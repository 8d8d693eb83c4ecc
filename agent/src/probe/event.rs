//! Ring-buffer record -> owned statement.
use agent_common::{EVENT_HEADER_LEN, StatementEvent, flags};

/// One finished statement as the kernel saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
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
