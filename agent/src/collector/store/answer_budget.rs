//! How much one Top answer may hold, and the cut when it would hold more.
//! Rows are counted by their encoded size as they are built, so a reader
//! asking for 10,000 digests that agents made large (64 KiB texts, every
//! sender list full) gets the first rows and a count of the rest instead
//! of a gigabyte built, serialized and refused.
use prost::Message as _;
use sqlbee_proto::v1::TopDigest;

/// Encoded bytes of the digests one Top answer holds (its JSON is about
/// twice that, below the 64 MiB an `/api/` or gRPC answer may be).
pub const TOP_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Digest texts in a lean read (comparisons, detection, tables) are cut
/// to this many bytes: those reads hold every digest of a range at once,
/// and a text is only shown there, never parsed.
pub const LEAN_TEXT_BYTES: usize = 4 * 1024;

/// Digests that made a Top cut, and how many of them were left out for the
/// answer's size.
#[derive(Debug, Default)]
pub struct TopPage {
    pub digests: Vec<TopDigest>,
    pub left_out: u64,
}

/// Counts the bytes of the rows taken so far.
#[derive(Debug)]
pub struct AnswerBudget {
    left: usize,
    full: bool,
}

impl Default for AnswerBudget {
    fn default() -> Self {
        AnswerBudget { left: TOP_ANSWER_BYTES, full: false }
    }
}

impl AnswerBudget {
    /// Takes `row` into `page` if it fits (the first row always does: an
    /// answer is never empty for its size alone). False: the answer is
    /// full, and the caller counts the rest as left out.
    pub fn take(&mut self, page: &mut TopPage, row: TopDigest) -> bool {
        let size = row.encoded_len();
        if self.full || (size > self.left && !page.digests.is_empty()) {
            // Full stays full: a smaller row after a cut would answer out
            // of rank order.
            self.full = true;
            return false;
        }
        self.left = self.left.saturating_sub(size);
        page.digests.push(row);
        true
    }

    /// How many more rows of the average size of the `answered` so far
    /// fit; None before any.
    pub fn more_rows_fitting(&self, answered: usize) -> Option<usize> {
        let used = TOP_ANSWER_BYTES - self.left;
        (answered > 0).then(|| self.left / (used / answered).max(1))
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
        let big = || TopDigest { digest_text: "x".repeat(TOP_ANSWER_BYTES / 4), ..Default::default() };
        let mut page = TopPage::default();
        let mut budget = AnswerBudget::default();
        for _ in 0..3 {
            assert!(budget.take(&mut page, big()));
        }
        assert!(!budget.take(&mut page, big()), "a fourth quarter and its framing are over");
        assert_eq!(page.digests.len(), 3);
        assert_eq!(budget.more_rows_fitting(3), Some(0));
        assert_eq!(AnswerBudget::default().more_rows_fitting(0), None);
        assert!(!budget.take(&mut page, TopDigest::default()), "a full answer stays full");
        let mut alone = TopPage::default();
        let huge = TopDigest { digest_text: "y".repeat(TOP_ANSWER_BYTES + 1), ..Default::default() };
        assert!(AnswerBudget::default().take(&mut alone, huge), "the first row is always answered");
    }

    #[test]
    fn lean_texts_are_cut_on_a_character() {
        assert_eq!(lean_text("SELECT 1".into()), "SELECT 1");
        let cut = lean_text("é".repeat(LEAN_TEXT_BYTES));
        assert!(cut.len() <= LEAN_TEXT_BYTES && cut.ends_with('…'), "{}", cut.len());
    }
}
