//! `sqlbee mcp`: the read side of a collector as Model Context Protocol
//! tools, over stdio, for an assistant to call.
//!
//! The transport is the protocol's stdio one: one JSON-RPC 2.0 message per
//! line on stdin, one answer per line on stdout, nothing else on stdout
//! (logs go to stderr). The handshake is the `initialize` one (protocol
//! revisions 2024-11-05 to 2025-11-25); a client that first probes a newer
//! revision's `server/discover` is told the method is not found and falls
//! back to it. Each tool call is one query command against the collector
//! (`tools`), with the session's token: what the token's role may read is
//! all a tool can read, and no tool writes.
mod tools;

use std::{
    io::{BufRead, Write},
    time::Instant,
};

use serde_json::{Value, json};

use crate::{ConnectArgs, QueryError};

#[derive(clap::Args, Debug, Clone)]
pub struct McpArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Protocol revisions this server speaks, newest first.
const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest message read: a tool call is a few hundred bytes, so a
/// longer line is refused (and skipped) rather than held in memory.
const MAX_MESSAGE: usize = 1024 * 1024;

/// JSON-RPC 2.0's error codes.
mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
}

/// Every tool as `tools/list` describes it (the manual lists them from
/// this).
pub fn tool_list() -> Vec<Value> {
    tools::all().iter().map(tools::Tool::describe).collect()
}

/// Serves the protocol on stdin and stdout until stdin ends.
pub fn serve(args: McpArgs) -> Result<(), QueryError> {
    let mut session = Session::new(args.connect);
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut output = std::io::stdout().lock();
    let mut line = Vec::new();
    loop {
        let answer = match read_message(&mut input, &mut line).map_err(|source| QueryError::Input { source })? {
            Message::End => return Ok(()),
            Message::TooLong => Some(error(
                Value::Null,
                code::PARSE_ERROR,
                &format!("message longer than {MAX_MESSAGE} bytes, skipped"),
            )),
            Message::Line => session.answer(&line),
        };
        if let Some(answer) = answer {
            serde_json::to_writer(&mut output, &answer)
                .map_err(std::io::Error::from)
                .and_then(|()| output.write_all(b"\n"))
                .and_then(|()| output.flush())
                .map_err(|source| QueryError::Output { source })?;
        }
    }
}

enum Message {
    Line,
    TooLong,
    End,
}

/// The next line of `input` into `line` (without its newline), or that it
/// was longer than `MAX_MESSAGE` (then read past and dropped).
fn read_message(input: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Message> {
    line.clear();
    let mut too_long = false;
    loop {
        let buffered = input.fill_buf()?;
        if buffered.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Message::TooLong,
                (false, true) => Message::End,
                (false, false) => Message::Line,
            });
        }
        let (chunk, ended) = match buffered.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffered[..at], Some(at + 1)),
            None => (buffered, None),
        };
        if !too_long && line.len() + chunk.len() <= MAX_MESSAGE {
            line.extend_from_slice(chunk);
        } else {
            too_long = true;
            line.clear();
        }
        let used = ended.unwrap_or(buffered.len());
        input.consume(used);
        if ended.is_some() {
            return Ok(if too_long { Message::TooLong } else { Message::Line });
        }
    }
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

fn result(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// One client's session: what it asked for, answered in order.
pub struct Session {
    connect: ConnectArgs,
    tools: Vec<tools::Tool>,
}

impl Session {
    pub fn new(connect: ConnectArgs) -> Session {
        Session { connect, tools: tools::all() }
    }

    /// The answer to one message, or none for a notification (and for a
    /// response: this server sends no requests).
    pub fn answer(&mut self, line: &[u8]) -> Option<Value> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let message: Value = match serde_json::from_slice(line) {
            Ok(message) => message,
            Err(e) => return Some(error(Value::Null, code::PARSE_ERROR, &format!("not JSON: {e}"))),
        };
        let Some(fields) = message.as_object() else {
            // Batches left the protocol in 2025-06-18.
            return Some(error(Value::Null, code::INVALID_REQUEST, "a message is one JSON-RPC 2.0 object"));
        };
        let id = fields.get("id").cloned();
        let valid_id = matches!(id, None | Some(Value::String(_) | Value::Number(_)));
        let Some(method) = fields.get("method").and_then(Value::as_str).filter(|_| valid_id) else {
            return match id {
                // A response to a request this server never sent.
                Some(_) if fields.contains_key("result") || fields.contains_key("error") => None,
                id => Some(error(
                    id.unwrap_or(Value::Null),
                    code::INVALID_REQUEST,
                    "no method, or an id that is \
                                                                                     not a string or a number",
                )),
            };
        };
        if fields.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(error(id.unwrap_or(Value::Null), code::INVALID_REQUEST, "jsonrpc must be \"2.0\""));
        }
        // Notifications (initialized, cancelled) need no answer.
        let id = id?;
        let params = fields.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => result(id, initialize(&params)),
            "ping" => result(id, json!({})),
            "tools/list" => {
                result(id, json!({ "tools": self.tools.iter().map(tools::Tool::describe).collect::<Vec<_>>() }))
            }
            "tools/call" => self.call(id, &params),
            _ => error(id, code::METHOD_NOT_FOUND, &format!("method not found: {method}")),
        })
    }

    fn call(&self, id: Value, params: &Value) -> Value {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return error(id, code::INVALID_PARAMS, "tools/call needs the tool's name");
        };
        let Some(tool) = self.tools.iter().find(|t| t.name == name) else {
            let known: Vec<&str> = self.tools.iter().map(|t| t.name).collect();
            return error(id, code::INVALID_PARAMS, &format!("unknown tool: {name} (tools: {})", known.join(", ")));
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => serde_json::Map::new(),
            Some(Value::Object(arguments)) => arguments.clone(),
            Some(_) => return error(id, code::INVALID_PARAMS, "a tool's arguments are a JSON object"),
        };
        let started = Instant::now();
        let answer = tool.call(&arguments, &self.connect);
        let ms = started.elapsed().as_millis() as u64;
        match answer {
            Ok(answer) => {
                tracing::info!(tool = name, ms, "tool answered");
                let text = answer.to_string();
                let mut content = json!({ "content": [{ "type": "text", "text": text }], "isError": false });
                // Structured content is an object; answers that are arrays
                // stay text, as the command prints them.
                if answer.is_object() {
                    content["structuredContent"] = answer;
                }
                result(id, content)
            }
            // A tool that fails answers with the reason, for the assistant
            // to read and act on (a wrong argument, a collector down).
            Err(e) => {
                tracing::warn!(tool = name, ms, error = %e, "tool failed");
                result(id, json!({ "content": [{ "type": "text", "text": e.to_string() }], "isError": true }))
            }
        }
    }
}

/// The handshake's answer: the client's revision when this server speaks
/// it, else the newest it speaks (the client then decides).
fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked.filter(|v| PROTOCOL_VERSIONS.contains(v)).unwrap_or(PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "sqlbee", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "sqlbee observes MySQL and MariaDB servers from the kernel. These tools read a sqlbee \
                         collector: call `instances` for the instance names, `top` for the digests that cost \
                         most, `diff` or `events` for what changed, `plans` and `findings` for why a digest is \
                         slow, `activity` for what runs now. Times are ranges back from now (10s, 5m, 2h, 7d) or \
                         milliseconds since the epoch. Statement texts are redacted; no tool writes or runs SQL.",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session::new(ConnectArgs {
            collector: "http://127.0.0.1:9".into(),
            token_file: None,
            ca_cert: None,
            client_cert: None,
            client_key: None,
        })
    }

    fn ask(session: &mut Session, message: &str) -> Value {
        session.answer(message.as_bytes()).expect("an answer")
    }

    #[test]
    fn the_handshake_takes_the_clients_revision_or_offers_the_newest() {
        let mut s = session();
        let a =
            ask(&mut s, r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#);
        assert_eq!(a["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(a["id"], 1);
        let a = ask(
            &mut s,
            r#"{"jsonrpc":"2.0","id":"x","method":"initialize","params":{"protocolVersion":"2099-01-01"}}"#,
        );
        assert_eq!(a["result"]["protocolVersion"], PROTOCOL_VERSIONS[0]);
        assert!(s.answer(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none());
    }

    #[test]
    fn bad_messages_get_the_error_they_deserve_and_the_session_goes_on() {
        let mut s = session();
        assert_eq!(ask(&mut s, "{not json")["error"]["code"], code::PARSE_ERROR);
        assert_eq!(ask(&mut s, "[1,2]")["error"]["code"], code::INVALID_REQUEST);
        assert_eq!(ask(&mut s, r#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#)["error"]["code"], code::INVALID_REQUEST);
        assert_eq!(
            ask(&mut s, r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#)["error"]["code"],
            code::INVALID_REQUEST
        );
        let a = ask(&mut s, r#"{"jsonrpc":"2.0","id":3,"method":"server/discover"}"#);
        assert_eq!(a["error"]["code"], code::METHOD_NOT_FOUND);
        let a = ask(&mut s, r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_sql"}}"#);
        assert_eq!(a["error"]["code"], code::INVALID_PARAMS);
        assert!(a["error"]["message"].as_str().unwrap().contains("unknown tool: run_sql"));
        let a = ask(&mut s, r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"annotate"}}"#);
        assert_eq!(a["error"]["code"], code::INVALID_PARAMS);
        // A response from the client is not answered.
        assert!(s.answer(br#"{"jsonrpc":"2.0","id":9,"result":{}}"#).is_none());
        assert_eq!(ask(&mut s, r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#)["result"], json!({}));
    }

    #[test]
    fn wrong_arguments_are_the_tools_error_not_the_sessions() {
        let mut s = session();
        let call = |args: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"top","arguments":{args}}}}}"#)
        };
        for (args, says) in [
            (r#"{"sql":"DROP TABLE t"}"#, "takes no argument \"sql\""),
            (r#"{"collector":"http://elsewhere:1"}"#, "takes no argument \"collector\""),
            (r#"{"limit":0}"#, "limit"),
            (r#"{"nested":"yes"}"#, "true or false"),
            (r#"{"order_by":"nonsense"}"#, "nonsense"),
        ] {
            let a = ask(&mut s, &call(args));
            assert_eq!(a["result"]["isError"], true, "{args}: {a}");
            let text = a["result"]["content"][0]["text"].as_str().unwrap();
            assert!(text.contains(says), "{args}: {text}");
        }
    }

    #[test]
    fn every_tool_reads_and_its_schema_comes_from_its_flags() {
        let mut s = session();
        let listed = ask(&mut s, r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        let tools = listed["result"]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert!(!names.contains(&"annotate"), "{names:?}");
        for tool in tools {
            assert_eq!(tool["annotations"]["readOnlyHint"], true);
            let properties = tool["inputSchema"]["properties"].as_object().unwrap();
            for session_flag in ["collector", "token_file", "format"] {
                assert!(!properties.contains_key(session_flag), "{}: {session_flag}", tool["name"]);
            }
        }
        let top = tools.iter().find(|t| t["name"] == "top").unwrap();
        let limit = &top["inputSchema"]["properties"]["limit"];
        assert_eq!((limit["type"].as_str(), limit["default"].as_u64()), (Some("integer"), Some(20)));
        assert_eq!(top["inputSchema"]["properties"]["nested"]["type"], "boolean");
        assert!(top["inputSchema"]["properties"]["order_by"]["enum"].as_array().unwrap().contains(&json!("p99")));
        // A command's positional argument is a tool argument too.
        let plans = tools.iter().find(|t| t["name"] == "plans").unwrap();
        assert_eq!(plans["inputSchema"]["properties"]["digest"]["type"], "string");
        let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"findings","arguments":{}}}"#;
        let a = ask(&mut s, call);
        assert_eq!(a["result"]["isError"], true);
        assert!(a["result"]["content"][0]["text"].as_str().unwrap().contains("per digest"), "{a}");
    }

    #[test]
    fn a_line_too_long_is_skipped_and_the_next_one_read() {
        let mut input = Vec::new();
        input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE + 10));
        input.extend(b"\n{\"a\":1}\nlast");
        let mut reader = std::io::BufReader::with_capacity(4096, &input[..]);
        let mut line = Vec::new();
        assert!(matches!(read_message(&mut reader, &mut line).unwrap(), Message::TooLong));
        assert!(matches!(read_message(&mut reader, &mut line).unwrap(), Message::Line));
        assert_eq!(line, b"{\"a\":1}");
        assert!(matches!(read_message(&mut reader, &mut line).unwrap(), Message::Line));
        assert_eq!(line, b"last");
        assert!(matches!(read_message(&mut reader, &mut line).unwrap(), Message::End));
    }
}
