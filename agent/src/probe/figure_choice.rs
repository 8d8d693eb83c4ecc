//! Which of the server's own figures the programs read (`--figures`). Every
//! statement is counted, timed, digested and its errors and schema kept
//! whatever is chosen; what a choice leaves out is never read, so it costs
//! mysqld nothing, and it is absent from every output (never 0), as a
//! figure the build does not let the agent read is.
use sqlbee_figures::{FIGURES, needs};
use sqlbee_kernel_abi::{ServerLayout, stats_field};

/// The `needs` bits (`sqlbee_figures::needs`) of the figures asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FigureChoice(u32);

/// The fields a record needs whatever figures are read: the connection
/// (accounts, clients), the replica's applier apart from clients, and a
/// statement that ends twice counted once.
const IDENTITY: u32 = stats_field::CONNECTION_ID | stats_field::SYSTEM_THREAD | stats_field::QUERY_ID;

impl FigureChoice {
    /// Every figure the build lets the agent read (the default).
    pub const ALL: FigureChoice = FigureChoice(u32::MAX);
    /// None of the server's figures: count, latency, lock time, errors,
    /// schema and account only.
    pub const LEAN: FigureChoice = FigureChoice(0);

    /// `all`, `lean`, or figure names (`rows_examined,cpu_ns`, as the
    /// JSON names them), which may follow `lean`. A figure read from the
    /// same server field as others brings them along (`tmp_tables` brings
    /// the plan's other counters): they cost the same read.
    pub fn parse(words: &[String]) -> Result<FigureChoice, String> {
        let words: Vec<&str> = words.iter().map(|w| w.trim()).filter(|w| !w.is_empty()).collect();
        if words.is_empty() {
            return Err("empty: use `all`, `lean`, or figure names".into());
        }
        if words == ["all"] {
            return Ok(FigureChoice::ALL);
        }
        let mut bits = 0;
        for word in words {
            if word == "lean" {
                continue;
            }
            match FIGURES.iter().find(|f| f.name == word) {
                Some(figure) => bits |= figure.needs,
                None => {
                    let names: Vec<&str> = FIGURES.iter().map(|f| f.name).collect();
                    return Err(format!(
                        "unknown figure `{word}`: use `all`, `lean`, or some of {} (`all` goes alone)",
                        names.join(", ")
                    ));
                }
            }
        }
        Ok(FigureChoice(bits))
    }

    /// Whether a figure that needs `needs` is asked for.
    pub fn wants(self, needs: u32) -> bool {
        self.0 & needs == needs
    }

    /// The names of the figures this choice leaves out, for the log.
    pub fn left_out(self) -> Vec<&'static str> {
        FIGURES.iter().filter(|f| !self.wants(f.needs)).map(|f| f.name).collect()
    }

    /// `layout` with only the chosen figures read: their fields placed
    /// again without the others, and no CPU time unless asked for.
    pub fn narrow(self, mut layout: ServerLayout) -> ServerLayout {
        if self == FigureChoice::ALL {
            return layout;
        }
        crate::discover::keep_statement_fields(&mut layout, IDENTITY | (self.0 & !needs::CPU));
        if !self.wants(needs::CPU) {
            layout.task_runtime_offset = 0;
        }
        layout
    }
}

#[cfg(test)]
mod tests {
    use sqlbee_kernel_abi::thd_field;

    use super::*;
    use crate::probe::Readable;

    fn words(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    /// A layout as discovery places MariaDB 10.11's fields: the counters
    /// in one window, the connection id far from them.
    fn placed() -> ServerLayout {
        let mut layout = ServerLayout { task_runtime_offset: 0x90, ..ServerLayout::default() };
        let found = [
            (thd_field::ROWS_SENT, 0x3b98),
            (thd_field::ROWS_EXAMINED, 0x3ba0),
            (thd_field::ROWS_AFFECTED, 0x3ba8),
            (thd_field::PLAN, 0x3c00),
            (thd_field::SERVER_STATUS, 0x3e00),
            (thd_field::QUERY_ID, 0x3e10),
            (thd_field::SYSTEM_THREAD, 0x3e18),
            (thd_field::CONNECTION_ID, 0x1000),
        ];
        for (field, at) in found {
            layout.field_at[field] = at;
            layout.stats_fields |= 1 << field;
        }
        crate::discover::keep_statement_fields(&mut layout, u32::MAX);
        layout
    }

    #[test]
    fn names_and_words_parse_to_their_needs() {
        assert_eq!(FigureChoice::parse(&words("all")), Ok(FigureChoice::ALL));
        assert_eq!(FigureChoice::parse(&words("lean")), Ok(FigureChoice::LEAN));
        let one = FigureChoice::parse(&words("lean, rows_examined")).unwrap();
        assert!(one.wants(needs::ROWS_EXAMINED) && !one.wants(needs::ROWS_SENT) && !one.wants(needs::CPU));
        let plan = FigureChoice::parse(&words("tmp_tables,cpu_ns")).unwrap();
        assert!(plan.wants(needs::PLAN) && plan.wants(needs::CPU) && !plan.wants(needs::SERVER_STATUS));
        assert!(FigureChoice::LEAN.wants(needs::ALWAYS), "lock time is always read");
        for bad in ["", "rows", "all,rows_sent", "lean,bogus"] {
            let err = FigureChoice::parse(&words(bad)).unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
        assert!(FigureChoice::parse(&words("bogus")).unwrap_err().contains("rows_examined"));
        assert_eq!(FigureChoice::LEAN.left_out().len(), FIGURES.iter().filter(|f| f.needs != needs::ALWAYS).count());
    }

    #[test]
    fn a_narrowed_layout_reads_only_what_was_chosen() {
        let all = placed();
        assert_eq!(FigureChoice::ALL.narrow(all), all);
        let everything = Readable::of(&all);
        assert!(everything.knows(needs::ROWS_EXAMINED) && everything.knows(needs::CPU));

        let lean = FigureChoice::LEAN.narrow(all);
        assert_eq!(lean.stats_fields, IDENTITY);
        assert_eq!(lean.task_runtime_offset, 0);
        let readable = Readable::of(&lean);
        for figure in FIGURES {
            assert_eq!(readable.knows(figure.needs), figure.needs == needs::ALWAYS, "{}", figure.name);
        }
        // The identity fields keep their offsets, and the window holds
        // only them: the counters' lines are not read.
        for field in [thd_field::QUERY_ID, thd_field::SYSTEM_THREAD, thd_field::CONNECTION_ID] {
            assert_eq!(lean.field_at[field], all.field_at[field]);
        }
        assert!(lean.stats_len < all.stats_len, "{} !< {}", lean.stats_len, all.stats_len);

        let rows = FigureChoice::parse(&words("rows_examined")).unwrap().narrow(all);
        assert_eq!(rows.stats_fields, IDENTITY | stats_field::ROWS_EXAMINED);
        assert!(Readable::of(&rows).knows(needs::ROWS_EXAMINED));
        assert!(!Readable::of(&rows).knows(needs::ROWS_SENT));
    }
}
