//! The tools `sqlbee mcp` offers: each is one query command, its input
//! schema generated from that command's own flags (a flag added to `sqlbee
//! top` is a tool argument the same day, with its help as description),
//! its answer exactly what the command prints with `--format json`. Only
//! reading commands are tools: `annotate` is not one, and the Query
//! service has no call that writes or runs SQL.
use clap::{Arg, ArgMatches, Args, Command, FromArgMatches, builder::ValueParser, value_parser};
use serde_json::{Map, Value, json};

use crate::{ConnectArgs, Format, QueryError};

/// One tool: a query command under the name an assistant calls it by.
pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
    /// The command whose flags are the tool's arguments.
    command: fn() -> Command,
    /// Runs the command on parsed flags against the session's collector,
    /// writing its JSON answer.
    run: fn(&ArgMatches, &ConnectArgs, &mut dyn std::io::Write) -> Result<(), ToolError>,
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{tool} takes no argument {name:?}; it takes: {known}")]
    UnknownArgument { tool: &'static str, name: String, known: String },
    #[error("argument {name:?} must be {expected}")]
    ArgumentType { name: String, expected: &'static str },
    #[error("{0}")]
    Arguments(String),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("the answer is not JSON: {0}")]
    Answer(#[from] serde_json::Error),
}

/// Builds a tool from a command's flags (`$args`) and the function that
/// writes its answer; the session's connection and `--format json` are
/// set here, so a tool's caller can change neither.
macro_rules! tool {
    ($name:literal, $args:ty, $run:path, $description:literal) => {
        Tool {
            name: $name,
            description: $description,
            command: || <$args>::augment_args(Command::new($name)),
            run: |matches, connect, out| {
                let mut args = <$args>::from_arg_matches(matches).map_err(|e| ToolError::Arguments(plain_error(&e)))?;
                args.connect = connect.clone();
                args.format = Format::Json;
                Ok($run(args, out)?)
            },
        }
    };
}

/// Every tool, in the order `tools/list` gives them.
pub fn all() -> Vec<Tool> {
    vec![
        tool!(
            "instances",
            crate::InstancesArgs,
            crate::instances_to,
            "The MySQL/MariaDB server instances and agents the collector knows: names to pass as `instance`, \
             versions, when each last reported, lag and gaps."
        ),
        tool!(
            "top",
            crate::TopArgs,
            crate::top_to,
            "The statement digests that cost the most in a time range (exact counts, latency percentiles, \
             errors, rows, waits, the server's own figures), across the fleet or for one instance, schema, \
             digest, stored program or client."
        ),
        tool!(
            "diff",
            crate::DiffArgs,
            crate::diff_to,
            "Two time ranges side by side: which digests regressed, improved, appeared or went, judged from \
             the exact latency histograms, with the schema and setting changes that preceded a regression."
        ),
        tool!(
            "plans",
            crate::PlansArgs,
            crate::plans_to,
            "Execution plans (EXPLAIN) of digests and when a digest's plan changed, with findings (full scans, \
             filesorts, missing indexes) and index suggestions. Plans exist for agents run with a server login."
        ),
        Tool {
            name: "findings",
            description: "What one digest's plan says is wrong, one row per finding: the table, the kind \
                          (full scan, sort without index, ...), the evidence, the suggested index and what to \
                          check before creating it. Needs the digest (from top).",
            command: || crate::PlansArgs::augment_args(Command::new("findings")),
            run: findings,
        },
        tool!(
            "tables",
            crate::TablesArgs,
            crate::tables_to,
            "Per-table totals: statements, time and rows examined of the digests that read or write each table, \
             the rows events replicas applied to it, and the changes made to it."
        ),
        tool!(
            "activity",
            crate::ActivityArgs,
            crate::activity_to,
            "What runs now on each server: every connection, its statement (redacted), how long it has run, \
             what it waits on and who blocks it."
        ),
        tool!(
            "long_statements",
            crate::LongArgs,
            crate::long_to,
            "Statements that ran longer than the agents' threshold, were killed, or lost their client: each with \
             its duration, waits and blocker."
        ),
        tool!(
            "replication",
            crate::ReplicationArgs,
            crate::replication_to,
            "What replicas applied: per replica, its transactions, lag at commit, the tables and event classes \
             that took its apply time, and the statements it applied beside its primary's."
        ),
        tool!(
            "locks",
            crate::LocksArgs,
            crate::locks_to,
            "Long lock waits with the waiting statement and its candidate blockers."
        ),
        tool!(
            "events",
            crate::EventsArgs,
            crate::events_to,
            "The timeline: regressions, new digests, plan changes, and changes made to the servers (DDL, SET \
             GLOBAL, grants, restarts) with who made them."
        ),
        tool!(
            "series",
            crate::SeriesArgs,
            crate::series_to,
            "One digest's, all statements' or the agents' cost over time, step by step."
        ),
    ]
}

/// Flags a tool's caller does not set: the session's connection and the
/// answer's format.
fn session_only(arg: &Arg) -> bool {
    let id = arg.get_id().as_str();
    ["collector", "token_file", "ca_cert", "client_cert", "client_key", "format", "help", "version"].contains(&id)
}

/// The flags a tool takes (and the command's positional arguments), by
/// their names in tool arguments.
fn flags(command: &Command) -> impl Iterator<Item = (String, &Arg)> {
    command
        .get_arguments()
        .filter(|a| !session_only(a) && !a.is_hide_set())
        .map(|a| (a.get_long().map_or_else(|| a.get_id().to_string(), |long| long.replace('-', "_")), a))
}

/// A flag's help as a tool's caller reads it: `--order-by` is
/// `order_by` there.
fn argument_names(help: &str) -> String {
    let mut out = String::with_capacity(help.len());
    let mut rest = help;
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let name = &rest[at + 2..];
        let len = name.find(|c: char| !(c.is_ascii_lowercase() || c == '-')).unwrap_or(name.len());
        if len == 0 {
            out.push_str("--");
        } else {
            out.push_str(&name[..len].replace('-', "_"));
        }
        rest = &name[len..];
    }
    out.push_str(rest);
    out
}

/// The JSON type of a flag's value.
fn json_type(arg: &Arg) -> &'static str {
    if !arg.get_action().takes_values() {
        return "boolean";
    }
    let parsed_as = arg.get_value_parser().type_id();
    let is = |parser: ValueParser| parser.type_id() == parsed_as;
    if is(value_parser!(u32).into()) || is(value_parser!(u64).into()) || is(value_parser!(i64).into()) {
        "integer"
    } else if is(value_parser!(f64).into()) {
        "number"
    } else {
        "string"
    }
}

impl Tool {
    /// The tool as `tools/list` describes it: name, description, an input
    /// schema from the command's flags, and the hints that it only reads.
    pub fn describe(&self) -> Value {
        let command = (self.command)();
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (name, arg) in flags(&command) {
            let kind = json_type(arg);
            let mut schema = json!({ "type": kind });
            if let Some(help) = arg.get_long_help().or(arg.get_help()) {
                schema["description"] = argument_names(&help.to_string()).into();
            }
            let values: Vec<String> = arg.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
            if kind == "string" && !values.is_empty() {
                schema["enum"] = values.into();
            }
            if let Some(default) = arg.get_default_values().first().and_then(|d| d.to_str()) {
                schema["default"] = match kind {
                    "integer" | "number" => serde_json::from_str(default).unwrap_or_else(|_| default.into()),
                    _ => default.into(),
                };
            }
            if arg.is_required_set() {
                required.push(name.clone());
            }
            properties.insert(name, schema);
        }
        json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
            "annotations": { "readOnlyHint": true, "destructiveHint": false, "openWorldHint": false },
        })
    }

    /// Runs the tool with `arguments` against `connect`'s collector: its
    /// answer as JSON.
    pub fn call(&self, arguments: &Map<String, Value>, connect: &ConnectArgs) -> Result<Value, ToolError> {
        let command = (self.command)();
        let mut argv = vec![self.name.to_string()];
        let mut positional = Vec::new();
        for (name, value) in arguments {
            let (_, arg) = flags(&command).find(|(known, _)| known == name).ok_or_else(|| {
                let known: Vec<String> = flags(&command).map(|(n, _)| n).collect();
                ToolError::UnknownArgument { tool: self.name, name: name.clone(), known: known.join(", ") }
            })?;
            let wrong = |expected| ToolError::ArgumentType { name: name.clone(), expected };
            let text = match (json_type(arg), value) {
                ("boolean", Value::Bool(true)) => None,
                ("boolean", Value::Bool(false)) => continue,
                ("boolean", _) => return Err(wrong("true or false")),
                (_, Value::String(text)) => Some(text.clone()),
                (_, Value::Number(n)) => Some(n.to_string()),
                (_, Value::Bool(_) | Value::Null | Value::Array(_) | Value::Object(_)) => {
                    return Err(wrong("a string or a number"));
                }
            };
            match (arg.get_long(), text) {
                (Some(long), None) => argv.push(format!("--{long}")),
                (Some(long), Some(text)) => argv.push(format!("--{long}={text}")),
                (None, text) => positional.push((arg.get_index().unwrap_or(0), text.unwrap_or_default())),
            }
        }
        // After `--`, a value that starts with `-` is still a value.
        positional.sort();
        argv.push("--".into());
        argv.extend(positional.into_iter().map(|(_, text)| text));
        let matches = command.try_get_matches_from(argv).map_err(|e| ToolError::Arguments(plain_error(&e)))?;
        let mut answer = Vec::new();
        (self.run)(&matches, connect, &mut answer)?;
        Ok(serde_json::from_slice(&answer)?)
    }
}

#[cfg(test)]
#[test]
fn flags_in_help_are_named_as_arguments() {
    assert_eq!(argument_names("as --client, or --order-by p99; -- stays"), "as client, or order_by p99; -- stays");
}

/// A clap error's first line: its usage lines and help hint are about the
/// command line, not the tool.
fn plain_error(error: &clap::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// `findings`: the plans answer, one row per finding of each plan.
fn findings(matches: &ArgMatches, connect: &ConnectArgs, mut out: &mut dyn std::io::Write) -> Result<(), ToolError> {
    let mut args = crate::PlansArgs::from_arg_matches(matches).map_err(|e| ToolError::Arguments(plain_error(&e)))?;
    if args.digest.is_none() {
        // The collector judges the plans of one digest, against its figures.
        return Err(ToolError::Arguments(
            "findings are judged per digest: pass digest (16 hex digits, from top)".into(),
        ));
    }
    args.connect = connect.clone();
    args.format = Format::Json;
    let mut answer = Vec::new();
    crate::plans_to(args, &mut answer)?;
    let plans: Value = serde_json::from_slice(&answer)?;
    let rows: Vec<Value> = plans["plans"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|plan| {
            plan["findings"].as_array().into_iter().flatten().map(move |finding| {
                let mut row = json!({
                    "instance": plan["instance"],
                    "schema": plan["schema"],
                    "digest": plan["digest"],
                    "digest_text": plan["digest_text"],
                    "plan_hash": plan["plan_hash"],
                    "last_seen_unix_ms": plan["last_seen_unix_ms"],
                });
                if let (Some(row), Some(finding)) = (row.as_object_mut(), finding.as_object()) {
                    row.extend(finding.clone());
                }
                row
            })
        })
        .collect();
    crate::render::write_json(&mut out, &json!({ "findings": rows }))
        .map_err(|source| QueryError::Output { source })?;
    Ok(())
}
