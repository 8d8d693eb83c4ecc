//! The collector's web UI in a real browser: headless Chromium opens every
//! page of a collector holding what a real agent shipped from a real
//! mariadbd, and the numbers on the pages are compared with `sqlbee top
//! --format json` over the same range. Sign-in is checked over plain HTTP
//! and over TLS. Screenshots of each page land in `target/ui-screenshots/`.
mod common;

use std::{collections::HashMap, path::Path, time::Duration};

use common::{
    Agent, PrivateServer, browser,
    collector::{Collector, TempDir, now_ms, top_answer},
    privileged,
};
use serde_json::Value;

/// Each `<tr>` of the table with id `table` that carries `data-` figures,
/// as attribute maps.
fn rows(dom: &str, table: &str) -> Vec<HashMap<String, String>> {
    let start = dom.find(&format!("id=\"{table}\"")).unwrap_or_else(|| panic!("no table {table} in the page"));
    let end = start + dom[start..].find("</table>").unwrap();
    let mut out = Vec::new();
    for tr in dom[start..end].split("<tr ").skip(1) {
        let head = &tr[..tr.find('>').unwrap()];
        let mut attrs = HashMap::new();
        for part in head.split("\" ") {
            if let Some((name, value)) = part.trim().split_once("=\"") {
                attrs.insert(name.to_string(), value.trim_end_matches('"').replace("&amp;", "&").to_string());
            }
        }
        out.push(attrs);
    }
    out
}

fn agent_args(server: &PrivateServer, collector: &Collector, state: &Path) -> Vec<String> {
    vec![
        format!("--pid={}", server.pid()),
        format!("--collector={}", collector.http_url()),
        format!("--state-dir={}", state.display()),
        "--window=1s".into(),
    ]
}

#[test]
fn every_page_shows_what_the_agent_shipped() {
    if !privileged("every_page_shows_what_the_agent_shipped")
        || !browser::available("every_page_shows_what_the_agent_shipped")
    {
        return;
    }
    let _serial = common::one_at_a_time();
    let server = PrivateServer::start("web-ui", &[]).unwrap();
    let collector = Collector::start(&[]);
    assert!(collector.ui.starts_with("http://127.0.0.1:"), "no UI URL: {:?}", collector.ui);
    server.sql("CREATE DATABASE shop; CREATE TABLE shop.orders (id INT PRIMARY KEY, total INT)").unwrap();
    let since = now_ms() - 60_000;
    let state = server.dir().join("agent-state");
    let agent = Agent::start(server.dir(), &agent_args(&server, &collector, &state));
    for i in 0..150 {
        server.sql(&format!("INSERT INTO shop.orders VALUES ({i}, {})", i * 3)).unwrap();
    }
    for i in 0..70 {
        server.sql(&format!("SELECT total FROM shop.orders WHERE id = {i}")).unwrap();
    }
    for _ in 0..4 {
        assert!(server.sql("SELECT * FROM shop.no_such_table").is_err());
    }
    server.sql("SELECT SLEEP(0.2)").unwrap();
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let until = now_ms() + 60_000;
    let (since, until) = (since.to_string(), until.to_string());
    let range = format!("since={since}&until={until}");

    // The numbers: the top page and /api/top against `sqlbee top`.
    let cli = top_answer(&collector.http_url(), &["--since", &since, "--until", &until, "--limit", "50"]);
    let api = reply(client(false).get(format!("{}api/top?{range}&limit=50", collector.ui)).call());
    assert_eq!(api.status, 200, "{}", api.body);
    let api: Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(api, cli, "/api/top answers what `sqlbee top --format json` prints");
    let top = browser::load(&format!("{}top?{range}&limit=50", collector.ui));
    assert!(top.console.is_empty(), "console messages on the top page: {:#?}", top.console);
    let shown = rows(&top.dom, "top");
    let digests = cli["digests"].as_array().unwrap();
    assert_eq!(shown.len(), digests.len(), "one row per digest");
    for d in digests {
        let row = shown
            .iter()
            .find(|r| {
                r["data-digest"] == d["digest"].as_str().unwrap() && r["data-schema"] == d["schema"].as_str().unwrap()
            })
            .unwrap_or_else(|| panic!("digest {} is not on the page", d["digest_text"]));
        for (attr, field) in
            [("data-count", "count"), ("data-errors", "errors"), ("data-sum-ns", "sum_ns"), ("data-p99-ns", "p99_ns")]
        {
            assert_eq!(row[attr], d[field].as_u64().unwrap().to_string(), "{field} of {}", d["digest_text"]);
        }
        // The sparkline's series (all rows' read at once) is this row's own.
        assert_eq!(row["data-trend-count"], row["data-count"], "the sparkline of {}", d["digest_text"]);
    }
    let insert = digests
        .iter()
        .find(|d| d["digest_text"] == "INSERT INTO `shop`.`orders` VALUES (...)")
        .expect("the insert digest");
    assert_eq!(insert["count"], 150);
    let select = digests
        .iter()
        .find(|d| d["digest_text"] == "SELECT `total` FROM `shop`.`orders` WHERE ID = ?")
        .expect("the select digest");
    assert_eq!(select["count"], 70);
    let missing = digests.iter().find(|d| d["errors"] == 4).expect("the failing statement");
    assert!(top.dom.contains("INSERT INTO `shop`.`orders` VALUES (...)"), "the top page names the workload's digests");
    let digest_link = format!("/digest?{}&amp;id={}", range.replace('&', "&amp;"), insert["digest"].as_str().unwrap());
    assert!(top.dom.contains(&digest_link), "the top page links to the digest page ({digest_link})");

    // The digest page: plots, and the same figures.
    let page = browser::load(&format!(
        "{}digest?{range}&id={}&schema={}",
        collector.ui,
        insert["digest"].as_str().unwrap(),
        insert["schema"].as_str().unwrap()
    ));
    assert!(page.console.is_empty(), "console messages on the digest page: {:#?}", page.console);
    assert!(page.dom.matches("<figure class=\"plot").count() >= 3, "latency, rate and heatmap plots");
    assert!(page.dom.contains("<polyline"), "the plots draw the statements");
    assert!(page.dom.contains("class=\"h"), "the heatmap has cells");
    let digest_rows = rows(&page.dom, "rows");
    assert_eq!(digest_rows.iter().map(|r| r["data-count"].parse::<u64>().unwrap()).sum::<u64>(), 150);
    let errors = browser::load(&format!("{}digest?{range}&id={}", collector.ui, missing["digest"].as_str().unwrap()));
    let codes = rows(&errors.dom, "errors");
    assert_eq!(codes.len(), 1, "one error code");
    assert_eq!(
        (codes[0]["data-code"].as_str(), codes[0]["data-count"].as_str()),
        ("1146", "4"),
        "ER_NO_SUCH_TABLE four times"
    );
    let errors_table = &errors.dom[errors.dom.find("id=\"errors\"").unwrap()..];
    let errors_table = &errors_table[..errors_table.find("</table>").unwrap()];
    assert!(errors_table.contains("Table '?'"), "with the server's message, redacted: {errors_table}");
    assert!(!errors_table.contains("no_such_table"), "no literal in clear: {errors_table}");

    // The fleet page: the instance's statements over the range.
    let fleet = browser::load(&format!("{}?{range}", collector.ui));
    assert!(fleet.console.is_empty(), "console messages on the fleet page: {:#?}", fleet.console);
    let instances = rows(&fleet.dom, "instances");
    assert_eq!(instances.len(), 1, "{instances:?}");
    let client_statements: u64 = digests.iter().map(|d| d["count"].as_u64().unwrap()).sum();
    assert_eq!(instances[0]["data-count"], client_statements.to_string(), "the fleet row counts what top counts");
    assert_eq!(instances[0]["data-errors"], "4");

    // The clients page: its rows add up to the digests' statements (named
    // clients, and those the agent could not name).
    let clients = browser::load(&format!("{}clients?{range}", collector.ui));
    let client_rows = rows(&clients.dom, "clients");
    let on_page: u64 =
        client_rows.iter().filter_map(|r| r.get("data-statements")).map(|n| n.parse::<u64>().unwrap()).sum();
    assert_eq!(on_page, client_statements, "{client_rows:?}");

    // Every page loads without a console message, and is photographed.
    let shots = browser::screenshot_dir();
    let insert_id = insert["digest"].as_str().unwrap();
    for (name, path) in [
        ("fleet", format!("?{range}")),
        ("top", format!("top?{range}")),
        ("digest", format!("digest?{range}&id={insert_id}")),
        ("locks", format!("locks?{range}")),
        ("clients", format!("clients?{range}")),
        ("hosts", format!("hosts?{range}")),
        ("cost", format!("cost?{range}")),
        ("login", "login".to_string()),
    ] {
        let url = format!("{}{path}", collector.ui);
        let loaded = browser::load(&url);
        assert!(loaded.console.is_empty(), "console messages on {name}: {:#?}", loaded.console);
        assert!(loaded.dom.contains("</main>"), "{name} rendered whole: {}", &loaded.dom[..loaded.dom.len().min(2000)]);
        assert!(loaded.load_ms().is_some(), "{name}: the page's script ran");
        let console = browser::screenshot(&url, &shots.join(format!("{name}.png")));
        assert!(console.is_empty(), "console messages on {name}: {console:#?}");
    }
    println!("screenshots in {}", shots.display());
}

/// An HTTP client that shows redirects and refusals instead of following
/// or raising them.
fn client(tls: bool) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder().max_redirects(0).http_status_as_error(false);
    if tls {
        // The certificate is the test's own; what is checked here is the
        // cookie, not the chain (gRPC's TLS tests check that).
        config = config.tls_config(ureq::tls::TlsConfig::builder().disable_verification(true).build());
    }
    config.build().into()
}

struct Reply {
    status: u16,
    location: String,
    cookie: String,
    body: String,
}

fn reply(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut response = response.expect("request");
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (location, cookie) = (header("location"), header("set-cookie"));
    Reply {
        status: response.status().as_u16(),
        location,
        cookie,
        body: response.body_mut().read_to_string().unwrap_or_default(),
    }
}

fn tokens_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        "read reader-7f3a9c-0123456789abcdef0123456789abcdef\ningest agent-51b2e0-0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    path
}

#[test]
fn the_ui_asks_for_a_read_token() {
    if !browser::available("the_ui_asks_for_a_read_token") {
        return;
    }
    let dir = TempDir::new("ui-auth");
    let tokens = tokens_file(dir.path());
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let ui = collector.ui.trim_end_matches('/').to_string();
    let http = client(false);

    // No token: pages go to the login page, /api/ is refused.
    let first = reply(http.get(format!("{ui}/top?since=1h")).call());
    assert_eq!(first.status, 303);
    assert_eq!(first.location, "/login?next=%2Ftop%3Fsince%3D1h");
    let login = browser::load(&format!("{ui}/top"));
    assert!(login.console.is_empty(), "{:#?}", login.console);
    assert!(
        login.dom.contains("<form class=\"login\"") && login.dom.contains("type=\"password\""),
        "the browser lands on the login page"
    );
    assert_eq!(reply(http.get(format!("{ui}/api/top")).call()).status, 401);

    // Wrong tokens are refused: unknown, and one that may only ingest.
    for (token, why) in [("guess", "not accepted"), ("agent-51b2e0-0123456789abcdef0123456789abcdef", "not read")] {
        let refused = reply(http.post(format!("{ui}/login")).send_form([("token", token), ("next", "/top")]));
        assert_eq!(refused.status, 401, "{token}");
        assert!(refused.cookie.is_empty(), "no session for {token}");
        assert!(refused.body.contains("Sign-in refused") && refused.body.contains(why), "{token}: {}", refused.body);
    }
    assert_eq!(
        reply(
            http.get(format!("{ui}/api/top"))
                .header("authorization", "Bearer agent-51b2e0-0123456789abcdef0123456789abcdef")
                .call()
        )
        .status,
        401
    );

    // The read token: a session cookie that scripts cannot read and other
    // sites cannot send, then the page asked for.
    let signed = reply(
        http.post(format!("{ui}/login"))
            .send_form([("token", "reader-7f3a9c-0123456789abcdef0123456789abcdef"), ("next", "/top?since=6h")]),
    );
    assert_eq!((signed.status, signed.location.as_str()), (303, "/top?since=6h"));
    assert!(signed.cookie.contains("HttpOnly") && signed.cookie.contains("SameSite=Strict"), "{}", signed.cookie);
    assert!(!signed.cookie.contains("Secure"), "plain HTTP: no Secure flag, or the browser would drop it");
    let cookie = signed.cookie.split(';').next().unwrap().to_string();
    let page = reply(http.get(format!("{ui}/top?since=6h")).header("cookie", &cookie).call());
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<h1>Top digests</h1>"));
    assert_eq!(
        reply(
            http.get(format!("{ui}/api/top"))
                .header("authorization", "Bearer reader-7f3a9c-0123456789abcdef0123456789abcdef")
                .call()
        )
        .status,
        200
    );
    // A login link cannot send the browser off-site.
    let offsite = reply(
        http.post(format!("{ui}/login"))
            .send_form([("token", "reader-7f3a9c-0123456789abcdef0123456789abcdef"), ("next", "//evil.example/")]),
    );
    assert_eq!(offsite.location, "/");

    // Hostile parameters come back as text, never as markup.
    let hostile = reply(
        http.get(format!("{ui}/top?instance=%3Cscript%3Ealert(1)%3C%2Fscript%3E")).header("cookie", &cookie).call(),
    );
    assert_eq!(hostile.status, 200);
    assert!(!hostile.body.contains("<script>alert(1)"), "reflected markup");
    assert!(hostile.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let bad = reply(http.get(format!("{ui}/top?since=%FF%FE")).header("cookie", &cookie).call());
    assert_eq!(bad.status, 400, "a range that is not one is a clear error: {}", bad.body);

    // Signing out ends the session.
    let out = reply(http.post(format!("{ui}/logout")).header("cookie", &cookie).send_empty());
    assert_eq!((out.status, out.location.as_str()), (303, "/login"));
    assert_eq!(reply(http.get(format!("{ui}/top")).header("cookie", &cookie).call()).status, 303);
}

#[test]
fn under_tls_the_session_cookie_is_secure() {
    use rcgen::{CertificateParams, KeyPair};
    let dir = TempDir::new("ui-tls");
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
    let (cert_path, key_path) = (dir.path().join("ui.crt"), dir.path().join("ui.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let tokens = tokens_file(dir.path());
    let collector = Collector::start(&[
        "--tokens".into(),
        tokens.display().to_string(),
        "--tls-cert".into(),
        cert_path.display().to_string(),
        "--tls-key".into(),
        key_path.display().to_string(),
    ]);
    assert!(
        collector.ui.starts_with("https://"),
        "the UI is served over TLS with the collector's certificate: {}",
        collector.ui
    );
    let https = client(true);
    let signed = reply(
        https
            .post(format!("{}login", collector.ui))
            .send_form([("token", "reader-7f3a9c-0123456789abcdef0123456789abcdef")]),
    );
    assert_eq!(signed.status, 303);
    assert!(signed.cookie.contains("Secure") && signed.cookie.contains("HttpOnly"), "{}", signed.cookie);
    // Plain HTTP to the TLS port gets no page.
    let plain = client(false).get(collector.ui.replace("https://", "http://")).call();
    assert!(plain.is_err() || reply(plain).status >= 400);
    std::thread::sleep(Duration::from_millis(10));
}

/// A connection to `to` from the loopback address `from` (127.0.0.2 and up
/// reach the same listener as 127.0.0.1 but count as another client).
fn connect_from(from: &str, to: std::net::SocketAddr) -> std::net::TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(to).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// The status code a raw HTTP exchange ended with, or 0 when the
/// collector closed the connection without an answer.
fn raw_status(stream: &mut std::net::TcpStream) -> u16 {
    use std::io::Read;
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = Vec::new();
    let _ = stream.read_to_end(&mut head);
    String::from_utf8_lossy(&head).split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

fn login_from(from: &str, ui: std::net::SocketAddr, token: &str) -> u16 {
    use std::io::Write;
    let mut stream = connect_from(from, ui);
    let form = format!("token={token}&next=%2F");
    write!(
        stream,
        "POST /login HTTP/1.1\r\nHost: {ui}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    )
    .unwrap();
    raw_status(&mut stream)
}

/// What a stranger can send to the sign-in page: a `next` that leaves the
/// site, a form posted from another site, token guesses by the dozen, and
/// forms that trickle in a byte at a time over many connections. Each is
/// refused or cut, and the UI keeps answering everyone else.
#[test]
fn sign_in_refuses_other_sites_guessers_and_trickles() {
    use std::io::Write;
    let dir = TempDir::new("ui-sign-in");
    let tokens = tokens_file(dir.path());
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let ui = collector.ui.trim_end_matches('/').to_string();
    let ui_addr: std::net::SocketAddr = ui.trim_start_matches("http://").parse().unwrap();
    let http = client(false);
    const READER: &str = "reader-7f3a9c-0123456789abcdef0123456789abcdef";

    // A tab that browsers drop would turn `/\t/evil.example` into
    // `//evil.example`.
    let tabbed = reply(http.post(format!("{ui}/login")).send_form([("token", READER), ("next", "/\t/evil.example")]));
    assert_eq!((tabbed.status, tabbed.location.as_str()), (303, "/"));

    // A form posted from another site is refused; from the UI's own, taken.
    let cross =
        reply(http.post(format!("{ui}/login")).header("origin", "http://evil.example").send_form([("token", READER)]));
    assert_eq!(cross.status, 403);
    assert!(cross.cookie.is_empty());
    let own = reply(http.post(format!("{ui}/login")).header("origin", &ui).send_form([("token", READER)]));
    assert_eq!(own.status, 303);

    // Guessing from one address: ten refusals, then 429 for that address
    // only, the right token included; another address signs in.
    for guess in 0..10 {
        assert_eq!(login_from("127.0.0.3", ui_addr, &format!("guess-{guess}")), 401, "guess {guess}");
    }
    assert_eq!(login_from("127.0.0.3", ui_addr, "guess-10"), 429);
    assert_eq!(login_from("127.0.0.3", ui_addr, READER), 429, "the guesser waits out its minute");
    assert_eq!(login_from("127.0.0.4", ui_addr, READER), 303, "another address is not held back");
    let logged = collector.stderr_text().matches("token refused").count();
    assert_eq!(logged, 1, "one log line for the guesser's minute:\n{}", collector.stderr_text());

    // 64 forms that trickle from one address: it holds at most its share
    // of connections, the rest of the world is answered at once, and each
    // trickle is cut when its form is late.
    let mut trickles = Vec::new();
    for _ in 0..64 {
        let mut stream = connect_from("127.0.0.2", ui_addr);
        let _ = write!(
            stream,
            "POST /login HTTP/1.1\r\nHost: {ui_addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: 1000\r\n\r\nto"
        );
        trickles.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    for _ in 0..5 {
        assert_eq!(reply(http.get(format!("{ui}/healthz")).call()).status, 200);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "healthz waited {:?}", started.elapsed());
    let statuses: Vec<u16> = trickles.iter_mut().map(raw_status).collect();
    let cut = statuses.iter().filter(|s| **s == 408).count();
    let closed = statuses.iter().filter(|s| **s == 0).count();
    assert_eq!(cut + closed, 64, "{statuses:?}");
    assert!(cut <= 8, "one address holds at most 8 connections: {cut} were served");
    assert!(started.elapsed() < Duration::from_secs(20), "trickles cut in time: {:?}", started.elapsed());
}

/// A large fleet keeps every page small: 250 instances with long names,
/// the picker becomes a field with at most 200 names offered, and the
/// fleet table shows 100 instances a page, every instance on one page.
#[test]
fn a_large_fleet_is_paged_and_the_picker_stays_small() {
    use common::collector::{batch, digest, ingest_client, plain, push, window};
    let collector = Collector::start(&[]);
    let long = "x".repeat(400);
    let names: Vec<String> = (0..250).map(|i| format!("db-{i:03}-{long}:3306")).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut client = ingest_client(&plain(&collector.http_url())).await;
        for (chunk, names) in names.chunks(50).enumerate() {
            let windows =
                names.iter().map(|n| window(n, 1, now_ms() - 1000, vec![digest("SELECT ?", &[1000])])).collect();
            push(&mut client, batch("agent-fleet", chunk as u64 + 1, windows)).await.unwrap();
        }
    });
    let ui = collector.ui.trim_end_matches('/').to_string();
    let http = client(false);
    let mut seen = std::collections::BTreeSet::new();
    for page in 1..=3 {
        let fleet = reply(http.get(format!("{ui}/?since=1h&page={page}")).call());
        assert_eq!(fleet.status, 200);
        assert!(fleet.body.len() < 1 << 20, "page {page} is {} bytes", fleet.body.len());
        assert!(fleet.body.contains("<datalist id=\"instance-names\">"), "the picker is a field");
        assert_eq!(fleet.body.matches("<option value=").count(), 200, "names offered");
        assert!(fleet.body.contains(&format!("data-page=\"{page}\" data-pages=\"3\"")));
        let rows = rows(&fleet.body, "instances");
        assert_eq!(rows.len(), if page < 3 { 100 } else { 50 }, "page {page}");
        for row in rows {
            assert!(seen.insert(row["data-instance"].clone()), "an instance on two pages: {}", row["data-instance"]);
        }
    }
    assert_eq!(seen.len(), 250, "every instance on one page");
}
