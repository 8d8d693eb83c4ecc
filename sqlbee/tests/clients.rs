//! Who sent it, as the node sees it: five real clients on one account send
//! the same statement to a real server, and the digest's client breakdown,
//! through a real agent and collector, names each with its exact count:
//! the `mariadb` command-line client and a Python program on the unix
//! socket (process and pid), this test over loopback TCP (process, pid and
//! address), the command-line client in a podman container (its container's
//! name), and a client over TCP from a network namespace of its own (its
//! address only: its socket is not in the server's namespace). Part of the
//! statements are counted in the kernel, which tells clients apart by the
//! key the agent gave each connection. Short connections, as a web request
//! makes them, are named too: the kernel wakes the agent for each. With a
//! login that may read `performance_schema.session_connect_attrs`, each
//! client also carries the program it said it is at connect, exactly.
mod common;

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Agent, PrivateServer, collector::Collector, collector::top_json, login_file, privileged, root_conn};
use mysql::prelude::Queryable;
use serde_json::Value;
use xtask::image::{MARIADB_IMAGE, podman};

const CLI: u64 = 300;
const PYTHON: u64 = 250;
const TCP: u64 = 200;
const CONTAINER: u64 = 150;
const NETNS: u64 = 100;
const STATEMENT: &str = "SELECT v FROM app.t WHERE id = 1";
const SHORT_CONNECTIONS: u64 = 40;
const SHORT_STATEMENTS: u64 = 10;
const SHORT: &str = "SELECT v + 1 FROM app.t WHERE id = 1";
const SHORT_TEXT: &str = "SELECT `v` + ? FROM `app`.`t` WHERE ID = ?";
const DIGEST_TEXT: &str = "SELECT `v` FROM `app`.`t` WHERE ID = ?";
/// Keeps each client connected past a few of the agent's drains, which
/// name a connection's client while it is open.
const LINGER: &str = "SELECT SLEEP(0.5)";

/// `count` statements, then the linger, as one script.
fn script(count: u64) -> String {
    let mut text = format!("{STATEMENT};\n").repeat(count as usize);
    text.push_str(LINGER);
    text.push_str(";\n");
    text
}

/// Runs `cmd` with `stdin`; panics with its stderr when it fails.
fn run_with_input(cmd: &mut Command, stdin: &str) {
    use std::io::Write;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A network namespace joined to the host by a veth pair, removed when
/// dropped: `host_ip` on the host's side, `inner_ip` inside.
struct Netns {
    name: String,
    host_ip: String,
    inner_ip: String,
}

impl Netns {
    fn create() -> Netns {
        let n = std::process::id() % 200 + 20;
        let name = format!("sqlbee-clients-{}", std::process::id());
        let (host, inner) = (format!("sqbh{n}"), format!("sqbc{n}"));
        let ns = Netns { name, host_ip: format!("10.213.{n}.1"), inner_ip: format!("10.213.{n}.2") };
        let _ = Command::new("ip").args(["netns", "del", &ns.name]).output();
        let _ = Command::new("ip").args(["link", "del", &host]).output();
        run(Command::new("ip").args(["netns", "add", &ns.name]));
        run(Command::new("ip").args(["link", "add", &host, "type", "veth", "peer", "name", &inner]));
        run(Command::new("ip").args(["link", "set", &inner, "netns", &ns.name]));
        run(Command::new("ip").args(["addr", "add", &format!("{}/24", ns.host_ip), "dev", &host]));
        run(Command::new("ip").args(["link", "set", &host, "up"]));
        let inside = |args: &[&str]| run(Command::new("ip").args(["netns", "exec", &ns.name, "ip"]).args(args));
        inside(&["addr", "add", &format!("{}/24", ns.inner_ip), "dev", &inner]);
        inside(&["link", "set", &inner, "up"]);
        inside(&["link", "set", "lo", "up"]);
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and the pair.
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// (program, process, address, container).
type ClientKey = (Option<String>, Option<String>, Option<String>, Option<String>);

/// The digest's clients: (program, process, address, container) -> count.
fn clients_of(row: &Value) -> BTreeMap<ClientKey, u64> {
    let text = |v: &Value| v.as_str().map(str::to_string);
    row["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let key = (text(&c["program"]), text(&c["process"]), text(&c["address"]), text(&c["container"]));
            (key, c["count"].as_u64().unwrap())
        })
        .fold(BTreeMap::new(), |mut all, (key, n)| {
            *all.entry(key).or_default() += n;
            all
        })
}

#[test]
fn each_client_of_a_digest_is_named_with_its_exact_count() {
    if !privileged("each_client_of_a_digest_is_named_with_its_exact_count") {
        return;
    }
    let image_present = podman().args(["image", "exists", MARIADB_IMAGE]).status().is_ok_and(|s| s.success());
    assert!(image_present, "{MARIADB_IMAGE} is missing (./x image builds it; ./x test does so first)");
    let _serial = common::one_at_a_time();
    let netns = Netns::create();
    // Connection attributes live only in performance_schema.
    let server = PrivateServer::start("clients", &["--bind-address=0.0.0.0", "--performance-schema=ON"]).unwrap();
    let mut conn = root_conn(&server);
    conn.query_drop(
        "CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES (1, 10); \
         CREATE USER app@'%' IDENTIFIED BY 'app-pw'; GRANT SELECT ON app.* TO app@'%'; \
         CREATE USER app@localhost IDENTIFIED BY 'app-pw'; GRANT SELECT ON app.* TO app@localhost; \
         CREATE USER sqlbee@localhost IDENTIFIED BY 'watch-pw'; \
         GRANT SELECT ON performance_schema.session_connect_attrs TO sqlbee@localhost",
    )
    .unwrap();
    drop(conn);
    let collector = Collector::start(&[]);
    let url = collector.http_url();
    let login = login_file(server.dir(), "sqlbee", "watch-pw");
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            format!("--collector={url}"),
            format!("--state-dir={}", server.dir().join("state").display()),
            "--window=1s".into(),
            format!("--server-login={}", login.display()),
        ],
    );
    let socket = server.socket.to_str().unwrap().to_string();
    let login = ["-u", "app", "-papp-pw"];

    // Short connections, as a web request makes them: connect, a few
    // statements, close, with no pause.
    let short = format!(
        "import pymysql\nfor _ in range({SHORT_CONNECTIONS}):\n    c = pymysql.connect(unix_socket={socket:?}, \
         user='app', password='app-pw')\n    cur = c.cursor()\n    for _ in range({SHORT_STATEMENTS}):\n        \
         cur.execute({SHORT:?})\n        cur.fetchall()\n    c.close()\n"
    );
    run(Command::new("/usr/bin/python3").args(["-c", &short]));
    // The command-line client on the unix socket.
    run_with_input(Command::new("mariadb").arg(format!("--socket={socket}")).args(login), &script(CLI));
    // A Python program on the unix socket.
    let python = format!(
        "import pymysql\nc = pymysql.connect(unix_socket={socket:?}, user='app', password='app-pw', \
         program_name='orders-service')\n\
         cur = c.cursor()\nfor _ in range({PYTHON}):\n    cur.execute({STATEMENT:?})\n    cur.fetchall()\n\
         cur.execute({LINGER:?})\nc.close()\n"
    );
    // Debian's, which has PyMySQL (setup installs it).
    run(Command::new("/usr/bin/python3").args(["-c", &python]));
    // This test over loopback TCP.
    let tcp = mysql::OptsBuilder::new()
        .ip_or_hostname(Some("127.0.0.1"))
        .tcp_port(server.port)
        .user(Some("app"))
        .pass(Some("app-pw"))
        .prefer_socket(false)
        .connect_attrs(Some(std::collections::HashMap::from([("program_name", "billing")])));
    let mut tcp = mysql::Conn::new(tcp).unwrap();
    for _ in 0..TCP {
        tcp.query_drop(STATEMENT).unwrap();
    }
    tcp.query_drop(LINGER).unwrap();
    drop(tcp);
    // The command-line client in a container, on the socket mounted in.
    let container = format!("sqlbee-client-{}", std::process::id());
    let dir = server.dir().to_str().unwrap().to_string();
    run_with_input(
        podman()
            .args(["run", "--rm", "-i", "--name", &container, "--network", "none"])
            .args(["-v", &format!("{dir}:/s"), "--entrypoint", "mariadb", MARIADB_IMAGE, "--socket=/s/mysqld.sock"])
            .args(login),
        &script(CONTAINER),
    );
    // The command-line client in a network namespace of its own, over TCP.
    run_with_input(
        Command::new("ip").args(["netns", "exec", &netns.name, "mariadb", "-h", &netns.host_ip]).args([
            format!("--port={}", server.port).as_str(),
            "-u",
            "app",
            "-papp-pw",
        ]),
        &script(NETNS),
    );

    let total = CLI + PYTHON + TCP + CONTAINER + NETNS;
    let started = Instant::now();
    let row = loop {
        let digests = top_json(&url, &["--limit", "50"]);
        let row = digests.as_array().unwrap().iter().find(|d| d["digest_text"] == DIGEST_TEXT).cloned();
        if let Some(row) = row.filter(|r| r["count"].as_u64() >= Some(total)) {
            break row;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not all counted within 30 s: {digests:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let short_row = top_json(&url, &["--limit", "50"])
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["digest_text"] == SHORT_TEXT)
        .cloned()
        .unwrap();
    let output = agent.stop();
    let stderr = output.stderr.clone();
    assert_eq!(row["count"], total, "{row:#}");

    let clients = clients_of(&row);
    let me = std::env::current_exe().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let python_exe =
        std::fs::read_link("/usr/bin/python3").unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let key = |program: &str, process: Option<&str>, address: Option<&str>, container: Option<&str>| {
        let text = |s: Option<&str>| s.map(str::to_string);
        (Some(program.to_string()), text(process), text(address), text(container))
    };
    // The command-line client calls itself `mysql`.
    let expected: BTreeMap<_, u64> = [
        (key("mysql", Some("mariadb"), None, None), CLI),
        (key("orders-service", Some(&python_exe), None, None), PYTHON),
        (key("billing", Some(&me), Some("127.0.0.1"), None), TCP),
        (key("mysql", Some("mariadb"), None, Some(&container)), CONTAINER),
        (key("mysql", None, Some(&netns.inner_ip), None), NETNS),
    ]
    .into_iter()
    .collect();
    assert_eq!(clients, expected, "{row:#}\nagent stderr:\n{stderr}");
    // This test's own connection carries its pid.
    let mine = row["clients"].as_array().unwrap().iter().find(|c| c["process"] == me.as_str()).unwrap();
    assert_eq!(mine["pid"], std::process::id(), "{mine:#}");
    // What the Python program said: its driver and its own pid.
    let python_row = row["clients"].as_array().unwrap().iter().find(|c| c["program"] == "orders-service").unwrap();
    assert!(python_row["driver"].as_str().is_some_and(|d| d.starts_with("pymysql ")), "{python_row:#}");
    assert_eq!(python_row["client_pid"], python_row["pid"], "{python_row:#}");
    // Grouped by process over the top digests: the container's client and
    // the command-line client are one program, the namespaced client has
    // no process, and the groups add up.
    // `sqlbee top ... --format json --since all` against this collector.
    let top_with = |extra: &[&str]| -> Value {
        let mut args = vec!["top"];
        args.extend_from_slice(extra);
        args.extend(["--format", "json", "--since", "all", "--collector", &url]);
        let out = common::collector::sqlbee_query(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let group = |by: &Value, value: &str| {
        by["groups"].as_array().unwrap().iter().find(|g| g["value"] == value).map(|g| {
            g["digests"].as_array().unwrap().iter().find(|d| d["digest_text"] == DIGEST_TEXT).unwrap()["count"].clone()
        })
    };
    let by = top_with(&["--by", "process", "--limit", "50"]);
    assert_eq!(group(&by, "mariadb"), Some((CLI + CONTAINER).into()), "{by:#}");
    assert_eq!(group(&by, &python_exe), Some(PYTHON.into()), "{by:#}");
    let missing = by["groups"].as_array().unwrap().iter().find(|g| g["missing"] == true).unwrap();
    assert!(
        missing["digests"].as_array().unwrap().iter().any(|d| d["digest_text"] == DIGEST_TEXT && d["count"] == NETNS)
    );
    // By the name each gave itself: the remote client is a `mysql` too.
    let by = top_with(&["--by", "program", "--limit", "50"]);
    assert_eq!(group(&by, "mysql"), Some((CLI + CONTAINER + NETNS).into()), "{by:#}");
    assert_eq!(group(&by, "orders-service"), Some(PYTHON.into()), "{by:#}");

    // Only the digests the container sent, with how many it sent.
    let only = top_with(&["--client", &container]);
    let only_row = only["digests"].as_array().unwrap().iter().find(|d| d["digest_text"] == DIGEST_TEXT).unwrap();
    assert_eq!(only_row["matched"], CONTAINER, "{only:#}");
    assert!(only["digests"].as_array().unwrap().iter().all(|d| d["matched"].as_u64() > Some(0)), "{only:#}");

    // The web UI: /api/top says what the CLI says, the digest page lists
    // each client, and the clients page has the container's.
    let get = |path: String| {
        ureq::get(format!("{}{path}", collector.ui)).call().unwrap().body_mut().read_to_string().unwrap()
    };
    let api: Value = serde_json::from_str(&get("api/top?since=all&limit=50".into())).unwrap();
    let api_row = api["digests"].as_array().unwrap().iter().find(|d| d["digest_text"] == DIGEST_TEXT).unwrap();
    assert_eq!(api_row["clients"], row["clients"]);
    let id = row["digest"].as_str().unwrap();
    let page = get(format!("digest?id={id}&since=all"));
    assert!(page.contains(&format!("data-process=\"{python_exe}\" data-count=\"{PYTHON}\"")), "{page}");
    assert!(page.contains(&format!("data-process=\"{me}\" data-count=\"{TCP}\"")), "{page}");
    let clients_page = get("clients?since=all".into());
    assert!(
        clients_page.contains(&format!("data-process=\"mariadb\" data-container=\"{container}\"")),
        "{clients_page}"
    );

    // Short connections are named while they last: the kernel wakes the
    // agent for each (a drain every 100 ms would see few of them). One that
    // closed before the agent looked is counted, unnamed.
    let short_total = SHORT_CONNECTIONS * SHORT_STATEMENTS;
    assert_eq!(short_row["count"], short_total, "{short_row:#}");
    let named: u64 = clients_of(&short_row).values().sum();
    assert!(named >= short_total / 4, "only {named} of {short_total} named: {short_row:#}");
    assert!(
        clients_of(&short_row).keys().all(|(_, process, _, _)| process.as_deref() == Some(python_exe.as_str())),
        "{short_row:#}"
    );

    // Part were counted in the kernel, per client (a connection's first
    // statements, until the agent has named it, come as records).
    let kernel_counted = output.summary_total(None, "aggregated_in_kernel");
    assert!(kernel_counted > 0, "none of {total} counted in the kernel");
}
