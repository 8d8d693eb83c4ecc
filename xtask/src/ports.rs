//! Free loopback ports for the servers tests start. The kernel may hand a
//! port out again to the next `bind(0)` as soon as the probe socket that
//! found it closes, and this process starts servers in parallel (MariaDB,
//! ClickHouse nodes, ZooKeeper): two of them given the same port race for
//! it, and the loser's readiness check is answered by the winner. So a
//! port is handed out once per process.
use std::{
    collections::HashSet,
    net::TcpListener,
    sync::{LazyLock, Mutex},
};

use anyhow::{Context as _, bail};

static HANDED_OUT: LazyLock<Mutex<HashSet<u16>>> = LazyLock::new(Mutex::default);

/// A loopback port nothing listens on now and this process never handed
/// out before.
pub fn free_port() -> anyhow::Result<u16> {
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding a probe socket to find a free port")?;
        let port = listener.local_addr()?.port();
        if HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return Ok(port);
        }
    }
    bail!("every free port the kernel offered was handed out already")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_port_is_handed_out_once() {
        let ports: Vec<u16> = (0..200).map(|_| super::free_port().unwrap()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
