//! What reading clients' connection attributes costs the agent, once per
//! naming round (never per statement): one query to
//! `performance_schema.session_connect_attrs` over the login, for the one
//! connection a round usually names and for a batch of 100 (a connection
//! storm), with 100 and with 1,000 connections open on the server, each
//! with its attributes: the server scans them all to answer.
//! `cargo bench -p sqlbee --bench connect_attrs`.
use std::{hint::black_box, time::Duration};

use criterion::Criterion;
use sqlbee_agent::{discover::AttrReader, server_login::ServerLogin};
use xtask::mariadb::PrivateServer;

const OPEN: [usize; 2] = [100, 1000];

fn main() {
    // SAFETY: raising this process's own descriptor limit to its hard limit.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    let server = PrivateServer::start("attrs-bench", &["--max-connections=2000", "--performance-schema=ON"])
        .expect("a private server");
    server
        .sql(
            "CREATE USER sqlbee@localhost IDENTIFIED BY 'bench-pw'; \
             GRANT SELECT ON performance_schema.session_connect_attrs TO sqlbee@localhost",
        )
        .unwrap();
    let opts = mysql::OptsBuilder::new()
        .socket(Some(server.socket.to_str().unwrap()))
        .user(Some("root"))
        .prefer_socket(true)
        .connect_attrs(Some(std::collections::HashMap::from([("program_name", "orders-service")])));
    let login = ServerLogin { user: "sqlbee".into(), password: "bench-pw".into() };
    let mut reader = AttrReader::new(login, server.pid());
    let mut criterion = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(8));
    let mut open: Vec<mysql::Conn> = Vec::new();
    for total in OPEN {
        while open.len() < total {
            open.push(mysql::Conn::new(opts.clone()).unwrap());
        }
        let mut ids: Vec<u64> = open.iter().map(|c| c.connection_id() as u64).collect();
        ids.sort_unstable();
        let (one, batch) = (&ids[..1], &ids[..100]);
        let said = reader.read(batch);
        assert_eq!(said.len(), 100, "every connection's attributes read");
        assert!(said.values().all(|a| a.program.as_deref() == Some("orders-service")));
        criterion.bench_function(&format!("attributes of one connection, {total} open"), |b| {
            b.iter(|| black_box(reader.read(black_box(one))))
        });
        criterion.bench_function(&format!("attributes of 100 connections, {total} open"), |b| {
            b.iter(|| black_box(reader.read(black_box(batch))))
        });
    }
    criterion.final_summary();
    drop(open);
}
