//! The collector holds under what one agent, one reader or a stranger can
//! send: each test here is an attack that once crashed it, filled its
//! memory, locked a door or buried someone else's data, run against the
//! real `sqlbee collector` binary over real sockets. No root needed; they
//! run once (SQLite), since none depends on the store's kind.
mod common;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use common::collector::*;
use sqlbee_proto::client::ClientOptions;
use sqlbee_proto::v1::{
    ActivityReport, AgentIdentity, AnnotateRequest, Blocker, InstanceActivity, LiveConnection, LockWait, LocksRequest,
    LongStatement, Plan, ServerInstance, annotate_client::AnnotateClient,
};
use tonic::Code;

/// One raw HTTP/1.1 exchange with the UI from `from` (a loopback address):
/// the status code and the body.
fn http(from: &str, ui: &str, path: &str, host: Option<&str>, token: Option<&str>) -> (u16, String) {
    let to: SocketAddr = ui.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    let mut stream = socket2_bind(from, to);
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let host = host.map_or_else(|| to.to_string(), str::to_string);
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    (code, body)
}

/// A TCP connection to `to` from the loopback address `from`.
fn socket2_bind(from: &str, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sockaddr = |addr: SocketAddr| {
        let SocketAddr::V4(v4) = addr else { panic!("IPv4 only") };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
            sin_zero: [0; 8],
        }
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2), bind(2) and connect(2) on a socket this function
    // owns, with valid sockaddr_in values; the fd is handed to TcpStream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let local = sockaddr(format!("{from}:0").parse().unwrap());
        let rc = libc::bind(fd, &local as *const libc::sockaddr_in as *const libc::sockaddr, len);
        assert_eq!(rc, 0, "bind {from}: {}", std::io::Error::last_os_error());
        let remote = sockaddr(to);
        let rc = libc::connect(fd, &remote as *const libc::sockaddr_in as *const libc::sockaddr, len);
        assert_eq!(rc, 0, "connect from {from}: {}", std::io::Error::last_os_error());
        stream
    }
}

fn activity(agent: &str, instance: &str, connections: Vec<LiveConnection>) -> ActivityReport {
    ActivityReport {
        agent: Some(AgentIdentity { agent_id: agent.into(), ..Default::default() }),
        taken_unix_ms: now_ms(),
        instances: vec![InstanceActivity {
            instance: Some(ServerInstance { name: instance.into(), ..Default::default() }),
            connections,
            ..Default::default()
        }],
    }
}

/// Depth of JSON nesting.
fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A blocking chain thousands of links long (one connection blocked by the
/// next): it once overflowed the collector's stack when read. Now it is
/// drawn to a bounded depth, the rest counted, on the page and in JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_chain_of_thousands_is_drawn_bounded() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut agent = ingest_client(&plain(&url)).await;
    push(&mut agent, batch("chainer", 1, vec![window("chain:3306", 1, now_ms(), vec![digest("SELECT ?", &[1000])])]))
        .await
        .unwrap();
    const LINKS: u64 = 5_000;
    let connections: Vec<LiveConnection> = (1..=LINKS)
        .map(|id| LiveConnection {
            thread_id: id,
            command: "Query".into(),
            running_ms: 1000,
            blocked_by: if id < LINKS { id + 1 } else { 0 },
            ..Default::default()
        })
        .collect();
    agent.push_activity(activity("chainer", "chain:3306", connections)).await.expect("activity of its own instance");
    let (code, body) = http("127.0.0.1", &collector.ui, "/api/activity", None, None);
    assert_eq!(code, 200, "{body}\n{}", collector.stderr_text());
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let chains = answer["chains"].as_array().unwrap();
    assert_eq!(chains.len(), 1);
    assert!(depth(&answer) < 100, "nesting {}", depth(&answer));
    // Follow the drawn chain to its cut and read what it counts below.
    let mut node = &chains[0];
    let mut drawn = 1;
    while let Some(next) = node["blocked"].as_array().and_then(|b| b.first()) {
        node = next;
        drawn += 1;
    }
    assert_eq!(drawn + node["more_blocked"].as_u64().unwrap(), LINKS, "every link drawn or counted");
    let (code, page) = http("127.0.0.1", &collector.ui, "/activity", None, None);
    assert_eq!(code, 200);
    assert!(page.contains("more connections wait below"), "{page}");
    // And it is still up for everyone else.
    push(&mut agent, batch("chainer", 2, vec![window("chain:3306", 1, now_ms(), vec![digest("SELECT ?", &[1000])])]))
        .await
        .unwrap();
}

/// Live activity is held as it sits in memory, decoded: empty connections,
/// two bytes each on the wire, count as the structs they become, and one
/// agent's reports past its share are refused. Reports for instances the
/// agent has sent no window of are refused too, and claim nothing: a
/// stream of them neither grows the owners' map nor squats a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_is_bounded_decoded_and_claims_nothing() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let mut greedy = ingest_client(&plain(&url)).await.max_encoding_message_size(64 << 20);
    for (sequence, instance) in ["big-a:3306", "big-b:3306"].into_iter().enumerate() {
        push(
            &mut greedy,
            batch("greedy", sequence as u64 + 1, vec![window(instance, 1, now_ms(), vec![digest("SELECT ?", &[1])])]),
        )
        .await
        .unwrap();
    }
    let empty = |n: u64| (0..n).map(|id| LiveConnection { thread_id: id, ..Default::default() }).collect::<Vec<_>>();
    greedy.push_activity(activity("greedy", "big-a:3306", empty(90_000))).await.expect("within its share");
    let refused = greedy.push_activity(activity("greedy", "big-b:3306", empty(90_000))).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("this agent's live activity"), "{}", refused.message());

    // Names no window claimed: refused, and left free.
    for i in 0..200 {
        let refused = greedy.push_activity(activity("greedy", &format!("squat-{i}:3306"), empty(1))).await.unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    let mut honest = ingest_client(&plain(&url)).await;
    push(&mut honest, batch("honest", 1, vec![window("squat-7:3306", 1, now_ms(), vec![digest("SELECT ?", &[1])])]))
        .await
        .expect("a name activity alone never claimed");
    honest.push_activity(activity("honest", "squat-7:3306", empty(3))).await.unwrap();
}

/// A push body that arrives in one burst and then stops holds its place
/// no longer than a pause allows: eight of them from two addresses, each
/// 7.5 MiB then silence, once kept every other agent out for two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_then_silence_does_not_hold_ingest() {
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let started = Instant::now();
    let stalls: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(
                async move { burst_then_stall(if i % 2 == 0 { "127.0.0.2" } else { "127.0.0.3" }, &url).await },
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut ordinary = ingest_client(&plain(&url)).await;
    let mut sequence = 0;
    let stored_after = loop {
        sequence += 1;
        let ok =
            batch("ordinary", sequence, vec![window("ordinary:3306", 2, now_ms(), vec![digest("SELECT ?", &[1])])]);
        match push(&mut ordinary, ok).await {
            Ok(_) => break started.elapsed(),
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(started.elapsed() < Duration::from_secs(40), "still refused: {status:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    assert!(stored_after < Duration::from_secs(40), "{stored_after:?}");
    for stall in stalls {
        let (code, message) = stall.await.unwrap();
        assert_eq!(code, Code::Unavailable, "{message}");
        assert!(message.contains("stopped arriving") || message.contains("too slowly"), "{message}");
    }
}

/// A push from `from` that sends 7.5 MiB of a declared 8 MiB message at
/// once, then nothing; the status the collector ends it with.
async fn burst_then_stall(from: &str, url: &str) -> (Code, String) {
    let to: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(8 << 20)
        .initial_connection_window_size(8 << 20)
        .handshake(stream)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = tonic::codegen::http::Request::post(format!("http://{to}/sqlbee.v1.Ingest/Push"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    let declared: u32 = 8 << 20;
    let mut frame = vec![0u8];
    frame.extend_from_slice(&declared.to_be_bytes());
    frame.extend(std::iter::repeat_n(0u8, (15 << 19) as usize));
    body.reserve_capacity(frame.len());
    body.send_data(prost::bytes::Bytes::from(frame), false).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(120), response).await.expect("an answer").unwrap();
    drop(body);
    let status = |headers: &tonic::codegen::http::HeaderMap| {
        let code = headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok());
        let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("").replace("%20", " ");
        code.map(|c| (Code::from_i32(c), message))
    };
    if let Some(answer) = status(response.headers()) {
        return answer;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk;
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    status(&trailers).unwrap_or((Code::Unknown, "no grpc-status".into()))
}

/// Clients that take every connection of the UI and never read: health
/// checks still get through, on places of their own.
#[test]
fn a_full_ui_still_answers_its_health_check() {
    let collector = Collector::start(&[]);
    let to: SocketAddr = collector.ui.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    // 32 addresses, 8 connections each: every place, each silent.
    let mut held = Vec::new();
    for a in 0..32u8 {
        for _ in 0..8 {
            held.push(socket2_bind(&format!("127.0.1.{}", a + 1), to));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let (code, body) = http("127.0.2.1", &collector.ui, "/healthz", None, None);
    assert_eq!((code, body.as_str()), (200, "ok\n"), "after {:?}", asked.elapsed());
    let (code, _) = http("127.0.2.2", &collector.ui, "/top", None, None);
    assert_eq!(code, 503, "a page waits for a place; health does not");
    drop(held);
}

/// A page on another site cannot read the UI through a name it points at
/// this host: only IP addresses, localhost and `--http-host` names are
/// answered.
#[test]
fn the_ui_answers_its_own_names_only() {
    let collector = Collector::start(&["--http-host".into(), "sqlbee.example.com".into()]);
    let ui = collector.ui.clone();
    let port = ui.trim_end_matches('/').rsplit(':').next().unwrap().to_string();
    assert_eq!(http("127.0.0.1", &ui, "/api/instances", Some(&format!("rebound.attacker.test:{port}")), None).0, 421);
    assert_eq!(http("127.0.0.1", &ui, "/api/instances", Some("sqlbee.example.com"), None).0, 200);
    assert_eq!(http("127.0.0.1", &ui, "/api/instances", Some(&format!("localhost:{port}")), None).0, 200);
    assert_eq!(http("127.0.0.1", &ui, "/api/instances", None, None).0, 200);
    assert_eq!(http("127.0.0.1", &ui, "/healthz", Some("anything.test"), None).0, 200);
}

/// Guessing tokens is throttled per address on gRPC and `/api/` alike, and
/// logged once per address and minute; a token with no entropy is refused
/// when the file is read, naming its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_tokens_is_throttled_and_weak_tokens_are_refused() {
    let dir = TempDir::new("guess");
    let tokens = dir.path().join("tokens");
    const GOOD: &str = "both 9f2c41d07ab3e85c61f0d92e4b7a30c5";
    std::fs::write(&tokens, format!("{GOOD}\n")).unwrap();
    let good = GOOD.split_whitespace().nth(1).unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let url = collector.http_url();
    let guess = |n: u32| ClientOptions { token: Some(format!("guess-{n:0>32}")), ..plain(&url) };
    let mut codes = std::collections::BTreeMap::new();
    for n in 0..30 {
        let mut client = query_client(&guess(n)).await;
        let code = client.instances(sqlbee_proto::v1::InstancesRequest::default()).await.unwrap_err().code();
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    assert_eq!(codes.get("Unauthenticated"), Some(&10), "{codes:?}");
    assert_eq!(codes.get("ResourceExhausted"), Some(&20), "{codes:?}");
    // The right token from that address waits too; from another it works.
    let mut right = query_client(&ClientOptions { token: Some(good.into()), ..plain(&url) }).await;
    assert_eq!(
        right.instances(sqlbee_proto::v1::InstancesRequest::default()).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let (code, _) = http("127.0.0.9", &collector.ui, "/api/instances", None, Some(good));
    assert_eq!(code, 200);
    for _ in 0..12 {
        http("127.0.0.10", &collector.ui, "/api/instances", None, Some("not-the-token-0123456789abcdef0123"));
    }
    assert_eq!(http("127.0.0.10", &collector.ui, "/api/instances", None, Some(good)).0, 429);
    let log = collector.stderr_text();
    let lines = log.lines().filter(|l| l.contains("token refused")).count();
    assert_eq!(lines, 2, "one line per address and minute:\n{log}");

    std::fs::write(&tokens, format!("{GOOD}\nread {}\n", "x".repeat(40))).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sqlbee"))
        .args(["collector", "--listen", "127.0.0.1:0", "--http-listen", "none", "--tokens"])
        .arg(&tokens)
        .arg("--store")
        .arg(format!("sqlite:{}", dir.path().join("weak.db").display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(":2: this token looks chosen"), "{stderr}");
}

/// A plan dated in the future would stay a digest's newest plan, fleet-wide,
/// for ever: plans are held to their window's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_are_held_to_their_windows_time() {
    let collector = Collector::start(&[]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await;
    let text = "SELECT ? FROM `t`";
    let mut w = window("plans:3306", 1, now_ms(), vec![digest(text, &[1000])]);
    w.plans = vec![Plan {
        digest: id_of(text),
        explained_unix_ms: 4_102_444_800_000,
        plan_hash: 7,
        plan_json: "{}".into(),
        ..Default::default()
    }];
    let refused = push(&mut agent, batch("planner", 1, vec![w.clone()])).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("plans[0].explained_unix_ms"), "{}", refused.message());
    w.plans[0].explained_unix_ms = w.window_end_unix_ms - 1_000;
    push(&mut agent, batch("planner", 2, vec![w])).await.expect("a plan of its window");
}

/// Plans and long statements are stored rows and count against the
/// agent's quota like the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_and_long_statements_are_charged_to_the_quota() {
    let collector = Collector::start(&["--agent-quota-rows".into(), "1000".into()]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await;
    let text = "SELECT ? FROM `t`";
    let mut w = window("quota:3306", 1, now_ms(), vec![digest(text, &[1000])]);
    w.plans = (0..600)
        .map(|i| Plan {
            digest: id_of(text),
            explained_unix_ms: w.window_end_unix_ms - 1_000,
            plan_hash: i + 1,
            ..Default::default()
        })
        .collect();
    let refused = push(&mut agent, batch("quoted", 1, vec![w.clone()])).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    w.plans.clear();
    w.long_statements = (0..1000)
        .map(|i| LongStatement {
            connection_id: i,
            start_unix_ms: w.window_end_unix_ms - 5_000,
            duration_ns: 3_000_000_000,
            outcome: "long".into(),
            ..Default::default()
        })
        .collect();
    let refused = push(&mut agent, batch("quoted", 2, vec![w])).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
}

/// With `--require-instance-pins`, no agent claims a name by reporting it
/// first: only instances a token pins are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_can_be_required() {
    let dir = TempDir::new("pins");
    let tokens = dir.path().join("tokens");
    const TOKEN: &str = "5b1e09c7d43fa2e8806b1c9d7f3a2e54";
    std::fs::write(&tokens, format!("ingest {TOKEN} instances=pinned:3306\n")).unwrap();
    let collector =
        Collector::start(&["--tokens".into(), tokens.display().to_string(), "--require-instance-pins".into()]);
    let mut agent = ingest_client(&ClientOptions { token: Some(TOKEN.into()), ..plain(&collector.http_url()) }).await;
    push(&mut agent, batch("pinned", 1, vec![window("pinned:3306", 1, now_ms(), vec![digest("SELECT ?", &[1])])]))
        .await
        .expect("its pinned instance");
    let dir2 = TempDir::new("pins-open");
    let tokens2 = dir2.path().join("tokens");
    std::fs::write(&tokens2, format!("ingest {TOKEN}\n")).unwrap();
    let unpinned =
        Collector::start(&["--tokens".into(), tokens2.display().to_string(), "--require-instance-pins".into()]);
    let mut agent = ingest_client(&ClientOptions { token: Some(TOKEN.into()), ..plain(&unpinned.http_url()) }).await;
    let refused =
        push(&mut agent, batch("free", 1, vec![window("free:3306", 1, now_ms(), vec![digest("SELECT ?", &[1])])]))
            .await
            .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("pinned to no token"), "{}", refused.message());
}

/// One token writes its share of markers an hour, so it cannot bury the
/// real ones under its own; markers that would read as something else
/// (bidirectional overrides) are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_are_bounded_per_token_and_shown_as_written() {
    let collector = Collector::start(&[]);
    let channel = channel(&plain(&collector.http_url())).await;
    let mut client = AnnotateClient::new(channel);
    let mark = |text: &str| AnnotateRequest { text: text.into(), instances: vec![], at_unix_ms: 0 };
    let refused = client.annotate(mark("deploy \u{202E}3.2v")).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let mut stored = 0;
    let mut last = Code::Ok;
    for i in 0..80 {
        match client.annotate(mark(&format!("early marker {i}"))).await {
            Ok(_) => stored += 1,
            Err(status) => last = status.code(),
        }
    }
    assert_eq!(stored, 60);
    assert_eq!(last, Code::ResourceExhausted);
}

/// Digests an agent made large (60 KB texts and samples) cannot make a
/// reader's Top answer gigabytes: the answer holds what fits its budget,
/// in rank order, and counts the rest, on `/api/`, the page and the CLI;
/// comparisons and tables read the same digests with their texts cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_answer_is_bounded_before_it_is_built() {
    let collector = Collector::start(&[]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await;
    const DIGESTS: usize = 400;
    let text = |n: usize| format!("SELECT ? FROM `t{n}` WHERE `c` IN ({})", "?, ".repeat(20_000));
    for part in 0..8 {
        let digests = (part * 50..part * 50 + 50).map(|n| digest(&text(n), &[1_000_000 * (n as u64 + 1)])).collect();
        let w = window("big:3306", 1, now_ms() - 60_000 + part as i64, digests);
        push(&mut agent, batch("big", part as u64 + 1, vec![w])).await.expect("a push of 50 large digests");
    }
    let (code, body) = http("127.0.0.1", &collector.ui, "/api/top?since=all&limit=10000", None, None);
    assert_eq!(code, 200, "{}", &body[..body.len().min(500)]);
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let answered = answer["digests"].as_array().unwrap().len();
    let left_out = answer["left_out"].as_u64().unwrap();
    assert_eq!(answered + left_out as usize, DIGESTS, "every digest answered or counted");
    assert!(left_out > 0 && answered > 50, "{answered} answered, {left_out} left out");
    assert!(body.len() < 64 << 20, "{} MiB", body.len() >> 20);
    // In rank order: the slowest (last pushed) first, none skipped.
    let first_texts: Vec<&str> =
        answer["digests"].as_array().unwrap().iter().map(|d| d["digest_text"].as_str().unwrap_or_default()).collect();
    for (rank, shown) in first_texts.iter().enumerate() {
        assert!(shown.starts_with(&format!("SELECT ? FROM `t{}`", DIGESTS - 1 - rank)), "rank {rank}");
    }
    let (code, page) = http("127.0.0.1", &collector.ui, "/top?since=all&limit=500", None, None);
    assert_eq!(code, 200);
    assert!(page.contains("more digests were left out"), "the page says so");
    let cli = top_answer(&collector.http_url(), &["--limit", "10000"]);
    assert_eq!(cli["left_out"].as_u64(), Some(left_out), "the CLI's JSON says so");
    // A comparison reads every digest of both ranges lean: texts cut to
    // 4 KiB.
    let (code, diff) = http("127.0.0.1", &collector.ui, "/api/diff?since=1h&limit=10000", None, None);
    assert_eq!(code, 200, "{}", &diff[..diff.len().min(500)]);
    let diff: serde_json::Value = serde_json::from_str(&diff).unwrap();
    let rows = diff["digests"].as_array().unwrap();
    assert_eq!(rows.len(), DIGESTS, "every digest compared");
    for row in rows {
        let shown = row["digest_text"].as_str().unwrap();
        assert!(shown.len() <= 4096 && shown.ends_with('…'), "{} bytes", shown.len());
    }
}

/// Lock waits an agent made large (60 KB texts and samples: 160 of them
/// are 19 MB) are answered newest first until the answer is full, and the
/// rest are counted: on the page, the CLI and the gRPC answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_wait_answer_is_bounded_before_it_is_built() {
    let collector = Collector::start(&[]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await;
    const WAITS: usize = 160;
    let filler = |n: usize| format!("SELECT ? FROM `t{n}` WHERE `c` IN ({})", "?, ".repeat(20_000));
    let now = now_ms();
    for part in 0..4 {
        let mut w = window("locked:3306", 1, now - 60_000 + part, vec![digest("SELECT ?", &[1_000])]);
        w.lock_waits = (0..WAITS / 4)
            .map(|n| {
                let text = filler(part as usize * 100 + n);
                LockWait {
                    start_unix_ms: w.window_end_unix_ms - 5_000 + n as i64,
                    duration_ns: 120_000_000,
                    class: "row_lock".into(),
                    connection_id: n as u64,
                    digest: id_of(&text),
                    sample: text.replace('?', "1"),
                    digest_text: text,
                    blocker_kind: "candidates".into(),
                    blockers: (0..2)
                        .map(|b| Blocker {
                            connection_id: 1_000 + b,
                            statements: vec![format!("UPDATE `t` SET `c` = ? WHERE `id` = {b}"); 8],
                            ..Default::default()
                        })
                        .collect(),
                }
            })
            .collect();
        push(&mut agent, batch("locked", part as u64 + 1, vec![w])).await.expect("a push of 40 large lock waits");
    }
    let answer = query_client(&plain(&collector.http_url()))
        .await
        .max_decoding_message_size(64 << 20)
        .locks(LocksRequest { since_unix_ms: 0, limit: 10_000, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let answered = answer.waits.len();
    assert_eq!(answered + answer.left_out as usize, WAITS, "every wait answered or counted");
    assert!(answer.left_out > 0 && answered > 1, "{answered} answered, {} left out", answer.left_out);
    let newest = answer.waits.iter().map(|r| r.wait.as_ref().unwrap().start_unix_ms).collect::<Vec<_>>();
    assert!(newest.windows(2).all(|p| p[0] >= p[1]), "newest first, the oldest left out");
    let (code, page) = http("127.0.0.1", &collector.ui, "/locks?since=all", None, None);
    assert_eq!(code, 200);
    assert!(page.contains("more lock waits were left out"), "the page says so");
    let cli = sqlbee_query(&["locks", "--collector", &collector.http_url(), "--since", "all", "--limit", "1000"]);
    assert!(cli.status.success());
    let said = String::from_utf8_lossy(&cli.stderr);
    assert!(said.contains(&format!("{} more lock waits were left out", answer.left_out)), "{said}");
}

/// Live activity of many instances, each of large statements (19 MB in
/// all), is answered by instance name until the answer is full; the rest
/// of the instances are counted, in JSON and on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activity_answer_is_bounded_before_it_is_built() {
    let collector = Collector::start(&[]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await.max_encoding_message_size(64 << 20);
    const INSTANCES: usize = 30;
    let names: Vec<String> = (0..INSTANCES).map(|n| format!("wide-{n:02}:3306")).collect();
    let windows = names.iter().map(|name| window(name, 1, now_ms(), vec![digest("SELECT ?", &[1])])).collect();
    push(&mut agent, batch("wide", 1, windows)).await.expect("windows claim the instances");
    let sample = format!("SELECT * FROM `t` WHERE `c` IN ({})", "1, ".repeat(2_600));
    let report = ActivityReport {
        agent: Some(AgentIdentity { agent_id: "wide".into(), ..Default::default() }),
        taken_unix_ms: now_ms(),
        instances: names
            .iter()
            .map(|name| InstanceActivity {
                instance: Some(ServerInstance { name: name.clone(), ..Default::default() }),
                connections: (0..80)
                    .map(|id| LiveConnection {
                        thread_id: id,
                        command: "Query".into(),
                        sample: sample.clone(),
                        running_ms: 1_000,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    };
    agent.push_activity(report).await.expect("within the agent's share");
    let (code, body) = http("127.0.0.1", &collector.ui, "/api/activity", None, None);
    assert_eq!(code, 200, "{}", &body[..body.len().min(500)]);
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let answered: Vec<&str> =
        answer["instances"].as_array().unwrap().iter().map(|i| i["instance"].as_str().unwrap()).collect();
    let left_out = answer["left_out"].as_u64().unwrap() as usize;
    assert!(left_out > 0 && !answered.is_empty(), "{} answered, {left_out} left out", answered.len());
    assert_eq!(answered, names[..INSTANCES - left_out], "by name, the last ones left out");
    let (code, page) = http("127.0.0.1", &collector.ui, "/activity", None, None);
    assert_eq!(code, 200);
    assert!(page.contains(&format!("{left_out} more instances were left out")), "the page says so");
}

/// A push of many small new digests grows the store about twenty times its
/// size on the wire; the byte quota charges what it stores, so 4 MB pushes
/// of 40,000 new digests each fill a 50 MiB quota after one, not twelve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_quota_charges_what_a_push_stores() {
    let collector = Collector::start(&["--agent-quota-mib".into(), "50".into()]);
    let mut agent = ingest_client(&plain(&collector.http_url())).await.max_encoding_message_size(64 << 20);
    let digests = |from: u64| (from..from + 40_000).map(|n| digest(&format!("SELECT {n}"), &[1])).collect::<Vec<_>>();
    let first = batch("small-rows", 1, vec![window("small:3306", 1, now_ms() - 20_000, digests(0))]);
    use prost::Message as _;
    assert!(first.encoded_len() < 5 << 20, "{} bytes on the wire", first.encoded_len());
    push(&mut agent, first).await.expect("the first fits");
    let second = batch("small-rows", 2, vec![window("small:3306", 1, now_ms() - 10_000, digests(40_000))]);
    let refused = push(&mut agent, second).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("bytes stored per hour"), "{}", refused.message());
}
