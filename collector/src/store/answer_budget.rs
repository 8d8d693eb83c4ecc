//! How much one answer may hold, and the cut when it would hold more.
//! Rows are counted by their encoded size as they are built, so a reader
//! asking for 10,000 digests or lock waits that agents made large (64 KiB
//! texts, every list full) gets the first rows and a count of the rest
//! instead of a gigabyte built, serialized and refused.
use prost::Message;
use sqlbee_proto::v1::TopDigest;

/// Encoded bytes of the rows one answer holds (its JSON is about twice
/// that, below the 64 MiB an `/api/` or gRPC answer may be).
pub const ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Digest texts in a lean read (comparisons, detection, tables) are cut
/// to this many bytes: those reads hold every digest of a range at once,
/// and a text is only shown there, never parsed.
pub const LEAN_TEXT_BYTES: usize = 4 * 1024;

/// The rows of an answer, in the order they were offered, and how many
/// more were left out because it was full.
#[derive(Debug)]
pub struct Page<T> {
    pub rows: Vec<T>,
    pub left_out: u64,
    left: usize,
}

pub type TopPage = Page<TopDigest>;

impl<T> Default for Page<T> {
    fn default() -> Self {
        Page { rows: Vec::new(), left_out: 0, left: ANSWER_BYTES }
    }
}

impl<T: Message> Page<T> {
    /// Every row of `rows`, none left out: a comparison's read answers all
    /// of its cut.
    pub fn all(rows: Vec<T>) -> Page<T> {
        Page { rows, ..Page::default() }
    }

    /// Once full, a page stays full: a smaller row after a cut would
    /// answer out of order. Callers count the rest with `skip` without
    /// building them.
    pub fn is_full(&self) -> bool {
        self.left_out > 0
    }

    /// Adds `row` if it fits (the first row always does: an answer is
    /// never empty for its size alone); else the page is full and the row
    /// is counted as left out.
    pub fn push(&mut self, row: T) {
        let size = row.encoded_len();
        if self.is_full() || (size > self.left && !self.rows.is_empty()) {
            self.left_out += 1;
            return;
        }
        self.left = self.left.saturating_sub(size);
        self.rows.push(row);
    }

    /// Counts a row left out unbuilt (the page is full).
    pub fn skip(&mut self) {
        self.left_out += 1;
    }

    /// How many more rows of the average size of those answered so far
    /// fit; None before any.
    pub fn more_rows_fitting(&self) -> Option<usize> {
        let used = ANSWER_BYTES - self.left;
        (!self.rows.is_empty()).then(|| self.left / (used / self.rows.len()).max(1))
    }
}

/// `text` cut to at most `LEAN_TEXT_BYTES` at a character boundary, with
/// an ellipsis that says it was cut.
pub fn lean_text(mut text: String) -> String {
    if text.len() > LEAN_TEXT_BYTES {
        let mut end = LEAN_TEXT_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_taken_until_the_budget_and_the_first_always() {
        let big = || TopDigest { digest_text: "x".repeat(ANSWER_BYTES / 4), ..Default::default() };
        let mut page = TopPage::default();
        for _ in 0..3 {
            page.push(big());
        }
        assert_eq!((page.rows.len(), page.left_out), (3, 0));
        assert_eq!(page.more_rows_fitting(), Some(0));
        page.push(big());
        assert_eq!((page.rows.len(), page.left_out), (3, 1), "a fourth quarter and its framing are over");
        page.push(TopDigest::default());
        page.skip();
        assert_eq!((page.rows.len(), page.left_out), (3, 3), "a full answer stays full");
        let mut alone = TopPage::default();
        assert_eq!(alone.more_rows_fitting(), None);
        alone.push(TopDigest { digest_text: "y".repeat(ANSWER_BYTES + 1), ..Default::default() });
        assert_eq!(alone.rows.len(), 1, "the first row is always answered");
    }

    #[test]
    fn lean_texts_are_cut_on_a_character() {
        assert_eq!(lean_text("SELECT 1".into()), "SELECT 1");
        let cut = lean_text("é".repeat(LEAN_TEXT_BYTES));
        assert!(cut.len() <= LEAN_TEXT_BYTES && cut.ends_with('…'), "{}", cut.len());
    }
}
