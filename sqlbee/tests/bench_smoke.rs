//! The overhead benchmark end to end at its smallest: every treatment in one
//! short pair, through the xtask library, against the debug sqlbee. It
//! proves the bench runs, records each treatment (a run or the reason it
//! failed) and writes its report, CSV and plots. It never looks at numbers:
//! on a shared 2-core machine they mean nothing at this size.
mod common;

use clap::Parser as _;
use xtask::bench::{Arm, BenchArgs, all_for_bench, bystanders::BystanderArgs, cost::CostArgs};

#[test]
fn every_treatment_runs_and_the_report_is_written() {
    if !common::privileged("every_treatment_runs_and_the_report_is_written") {
        return;
    }
    let _serial = common::one_at_a_time();
    let out_dir = std::env::temp_dir().join(format!("sqlbee-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = BenchArgs::try_parse_from([
        "bench",
        "--quick",
        "--pairs",
        "1",
        "--seconds",
        "2",
        "--threads",
        "2",
        "--tables",
        "1",
        "--table-size",
        "2000",
        "--scripts",
        "oltp_point_select",
        "--treatments",
        "all",
        "--no-micro",
        "--name",
        "smoke",
        "--agent-bin",
        env!("CARGO_BIN_EXE_sqlbee"),
        "--out-dir",
        out_dir.to_str().unwrap(),
    ])
    .expect("bench arguments");
    let outcome = xtask::bench::run(&args).expect("the bench itself (server, data set, result files)");

    // `all` leaves out what only bench-rate runs (start-up flags on every
    // arm's server); those have bench-rate's own unit tests.
    let treatments: Vec<_> = all_for_bench().collect();
    for t in &treatments {
        let run = outcome
            .runs
            .iter()
            .find(|r| r.treatment == t.name && r.arm == Arm::Treatment)
            .unwrap_or_else(|| panic!("no run recorded for treatment {}", t.name));
        if let Some(reason) = &run.error {
            assert!(!reason.trim().is_empty(), "{} failed without a reason", t.name);
            eprintln!("{}: recorded failure: {reason}", t.name);
        }
        assert!(
            outcome.runs.iter().any(|r| r.treatment == t.name && r.arm == Arm::Control),
            "no control run for treatment {}",
            t.name
        );
    }
    assert_eq!(outcome.runs.len(), treatments.len() * 2, "one control and one treatment run per treatment");

    for path in [&outcome.report, &outcome.csv].into_iter().chain(&outcome.plots) {
        let len = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).len();
        assert!(len > 0, "{} is empty", path.display());
    }
    assert!(
        outcome.plots.iter().any(|p| p.extension().is_some_and(|e| e == "svg")),
        "no SVG plots: {:?}",
        outcome.plots
    );
    let markdown = std::fs::read_to_string(&outcome.report).unwrap();
    for plot in &outcome.plots {
        let file = plot.file_name().unwrap().to_str().unwrap();
        assert!(markdown.contains(file), "the report does not link {file}");
    }
    let csv = std::fs::read_to_string(&outcome.csv).unwrap();
    // Failure reasons are quoted CSV fields and may hold newlines: count
    // records, not lines.
    let records = csv_records(&csv);
    assert_eq!(records - 1, outcome.runs.len(), "CSV rows (after the header) vs runs:\n{csv}");

    let _ = std::fs::remove_dir_all(&out_dir);
}

/// The agent-cost benchmark at its smallest: every step at a fixed rate and
/// unlimited, each run recorded, the report written. Numbers unchecked.
#[test]
fn cost_bench_runs_every_step() {
    if !common::privileged("cost_bench_runs_every_step") {
        return;
    }
    let _serial = common::one_at_a_time();
    let out_dir = std::env::temp_dir().join(format!("sqlbee-cost-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = CostArgs::try_parse_from([
        "bench-cost",
        "--rates",
        "500,0",
        "--seconds",
        "2",
        "--threads",
        "2",
        "--tables",
        "1",
        "--table-size",
        "2000",
        "--window",
        "1s",
        "--name",
        "smoke",
        "--agent-bin",
        env!("CARGO_BIN_EXE_sqlbee"),
        "--out-dir",
        out_dir.to_str().unwrap(),
    ])
    .expect("bench-cost arguments");
    let outcome = xtask::bench::cost::run(&args).expect("the cost bench itself");
    let steps = ["none", "exact", "no-samples", "known-texts-only", "events"];
    assert_eq!(outcome.runs.len(), 2 * steps.len());
    for run in &outcome.runs {
        assert!(run.error.is_none(), "{} at {}: {:?}", run.step, run.target_qps, run.error);
        assert!(run.qps > 0.0, "{run:?}");
        if run.step != "none" {
            assert!(run.agent_peak_rss_kib > 0, "{run:?}");
        }
    }
    // A pinned step is the step the agent reports.
    for run in outcome.runs.iter().filter(|r| r.step == "no-samples" || r.step == "known-texts-only") {
        assert_eq!(run.reported_step, run.step, "{run:?}");
    }
    let markdown = std::fs::read_to_string(&outcome.report).unwrap();
    assert_eq!(
        markdown.lines().filter(|l| l.starts_with("| 500 ") || l.starts_with("| max ")).count(),
        outcome.runs.len()
    );
    let csv = std::fs::read_to_string(&outcome.csv).unwrap();
    assert_eq!(csv.lines().count(), outcome.runs.len() + 1);
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn bystanders_bench_measures_every_arm_in_every_round() {
    if !common::privileged("bystanders_bench_measures_every_arm_in_every_round") {
        return;
    }
    let _serial = common::one_at_a_time();
    let out_dir = std::env::temp_dir().join(format!("sqlbee-bystanders-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let args = BystanderArgs::try_parse_from([
        "bench-bystanders",
        "--arms",
        "control,sqlbee-send",
        "--rounds",
        "2",
        "--calls",
        "20000",
        "--name",
        "smoke",
        "--agent-bin",
        env!("CARGO_BIN_EXE_sqlbee"),
        "--out-dir",
        out_dir.to_str().unwrap(),
    ])
    .expect("bench-bystanders arguments");
    let report = xtask::bench::bystanders::run(&args).expect("the bystanders bench itself");
    let markdown = std::fs::read_to_string(&report).unwrap();
    for arm in ["control", "sqlbee-send"] {
        assert!(markdown.lines().any(|l| l.starts_with(&format!("| {arm} |"))), "{markdown}");
    }
    let csv = std::fs::read_to_string(report.with_extension("csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    // Every measurement is a time per call, not a placeholder.
    for row in rows {
        let ns: Vec<f64> = row.split(',').skip(2).map(|v| v.parse().unwrap()).collect();
        assert!(ns.iter().all(|&v| v > 10.0 && v < 1_000_000.0), "{row}");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Records in CSV text, newlines inside quoted fields not counted.
fn csv_records(text: &str) -> usize {
    let mut quoted = false;
    let mut records = 0;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '\n' if !quoted => records += 1,
            _ => {}
        }
    }
    records
}
