//! Which of the object's two copies of each program this kernel attaches.
//!
//! Every program exists as a `uprobe.multi` program and as a classic
//! uprobe (named with `_perf`). The classic attach makes a per-task perf
//! event, and while any exists the kernel runs its perf hooks at every
//! context switch on the host, a cost mysqld pays per statement even when
//! no probe fires; the first one also waits for an RCU grace period, which
//! took seconds on a saturated host. A multi link needs no perf event, so
//! it is used wherever the kernel filters it by process (6.6 and later
//! with the pid-filter fix).
pub use crate::discover::multi_links;

/// The object's name of `program` in this kernel's attach mode.
pub fn object_name(program: &'static str) -> &'static str {
    if multi_links() { program } else { perf_name(program) }
}

/// Every program of the object and its classic copy (`None`: it attaches
/// only through a multi link, and is left out on kernels without them).
pub const PROGRAMS: [(&str, Option<&str>); 13] = [
    ("statement_end", Some("statement_end_perf")),
    ("command_start", Some("command_start_perf")),
    ("error_raised", Some("error_raised_perf")),
    ("wait_begin", Some("wait_begin_perf")),
    ("wait_end", Some("wait_end_perf")),
    ("schema_change", Some("schema_change_perf")),
    ("account_change", Some("account_change_perf")),
    ("nested_start", Some("nested_start_perf")),
    ("nested_end", Some("nested_end_perf")),
    ("calibrate", Some("calibrate_perf")),
    ("value_set", None),
    ("apply_start", Some("apply_start_perf")),
    ("apply_end", Some("apply_end_perf")),
];

fn perf_name(program: &'static str) -> &'static str {
    match PROGRAMS.iter().find(|(name, _)| *name == program) {
        Some((_, Some(perf))) => perf,
        // A program without a classic copy: loading it fails with the
        // kernel's own error, which names it.
        _ => program,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

    /// The programs that run when the probed function returns.
    const RETURN_PROBES: [&str; 1] = ["apply_end"];

    #[test]
    fn every_program_has_its_classic_copy_in_the_object() {
        let object = object::File::parse(super::super::attach::EBPF_OBJECT).expect("the embedded object parses");
        let section_of = |name: &str| {
            let symbol = object.symbols().find(|s| s.name() == Ok(name)).unwrap_or_else(|| panic!("{name} missing"));
            let index = symbol.section_index().expect("a program lives in a section");
            object.section_by_index(index).expect("its section exists").name().expect("named").to_owned()
        };
        for (program, perf) in PROGRAMS {
            // A return probe's sections say so.
            let kind = if RETURN_PROBES.contains(&program) { "uretprobe" } else { "uprobe" };
            assert_eq!(section_of(program), format!("{kind}.multi"), "{program}");
            if let Some(perf) = perf {
                assert_eq!(section_of(perf), kind, "{perf}");
            }
        }
        // And every multi program of the object is listed.
        let multi: Vec<String> = object
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter(|s| {
                let section = s.section_index().and_then(|i| object.section_by_index(i).ok()?.name().ok());
                matches!(section, Some("uprobe.multi" | "uretprobe.multi"))
            })
            .map(|s| s.name().expect("named").to_owned())
            .collect();
        for name in &multi {
            assert!(PROGRAMS.iter().any(|(p, _)| p == name), "{name} is not in link_mode::PROGRAMS");
        }
    }
}
