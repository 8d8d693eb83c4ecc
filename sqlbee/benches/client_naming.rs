//! What naming a connection's client costs the agent, once per connection
//! (never per statement): a unix-socket peer (a copy of the server's fd,
//! `SO_PEERCRED`, the peer's /proc entries), a loopback TCP peer (the
//! network table, then every process's fds, or only those of a process
//! seen holding a client before), and a batch of 100 unix-socket
//! connections. This process plays the server:
//! it holds both ends of each socket. `cargo bench -p sqlbee --bench
//! client_naming`.
use std::{
    hint::black_box,
    net::{TcpListener, TcpStream},
    os::{fd::AsRawFd, unix::net::UnixStream},
};

use criterion::{Criterion, criterion_group, criterion_main};
use sqlbee_agent::discover::{ClientConnection, ClientResolver, resolve_clients};

fn benches(c: &mut Criterion) {
    let me = std::process::id();
    let (server_end, _client_end) = UnixStream::pair().unwrap();
    let unix = [ClientConnection { server_pid: me, socket_fd: server_end.as_raw_fd() }];
    assert!(resolve_clients(&unix)[0].pid.is_some());
    c.bench_function("a unix-socket client", |b| b.iter(|| black_box(resolve_clients(black_box(&unix)))));

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let _tcp_client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (tcp_server_end, _) = listener.accept().unwrap();
    let tcp = [ClientConnection { server_pid: me, socket_fd: tcp_server_end.as_raw_fd() }];
    assert!(resolve_clients(&tcp)[0].pid.is_some());
    c.bench_function("a loopback TCP client, every process scanned", |b| {
        b.iter(|| black_box(resolve_clients(black_box(&tcp))))
    });
    // As the agent keeps it: the process that held the last loopback
    // client's socket is looked through first.
    let mut resolver = ClientResolver::default();
    c.bench_function("a loopback TCP client from a process seen before", |b| {
        b.iter(|| black_box(resolver.resolve(black_box(&tcp))))
    });

    let pairs: Vec<(UnixStream, UnixStream)> = (0..100).map(|_| UnixStream::pair().unwrap()).collect();
    let batch: Vec<ClientConnection> =
        pairs.iter().map(|(s, _)| ClientConnection { server_pid: me, socket_fd: s.as_raw_fd() }).collect();
    c.bench_function("100 unix-socket clients in one drain", |b| {
        b.iter(|| black_box(resolve_clients(black_box(&batch))))
    });
}

criterion_group!(name = group; config = Criterion::default().sample_size(30); targets = benches);
criterion_main!(group);
