//! Where to reach a traced server, learned from the process itself: the
//! unix socket it listens on (through `/proc/PID/root`, so a sidecar that
//! shares only the pid namespace reaches it too) or else its loopback TCP
//! port. Nobody has to tell the agent an address.
use std::{collections::HashSet, path::PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerAddress {
    /// A path the agent can open (under `/proc/PID/root`).
    Socket(PathBuf),
    Tcp(u16),
}

impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddress::Socket(path) => write!(f, "socket {}", path.display()),
            ServerAddress::Tcp(port) => write!(f, "127.0.0.1:{port}"),
        }
    }
}

/// The server's listening unix socket, or else its TCP port; None when
/// the process listens on neither (or is gone).
pub fn address_of(pid: u32) -> Option<ServerAddress> {
    let inodes = socket_inodes(pid);
    if inodes.is_empty() {
        return None;
    }
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let unix = std::fs::read_to_string(proc_dir.join("net/unix")).unwrap_or_default();
    if let Some(path) = listening_unix_socket(&unix, &inodes) {
        return Some(ServerAddress::Socket(proc_dir.join("root").join(path.trim_start_matches('/'))));
    }
    ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(proc_dir.join(table)).ok())
        .find_map(|table| listening_tcp_port(&table, &inodes))
        .map(ServerAddress::Tcp)
}

/// Inodes of the sockets the process holds open.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

/// `Num RefCount Protocol Flags Type St Inode Path`: a listening socket has
/// the accept flag (0x10000) and a path (abstract ones start with `@`).
fn listening_unix_socket(table: &str, inodes: &HashSet<u64>) -> Option<String> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
        let inode: u64 = fields.get(6)?.parse().ok()?;
        let path = fields.get(7)?;
        (flags & 0x10000 != 0 && inodes.contains(&inode) && path.starts_with('/')).then(|| path.to_string())
    })
}

/// `sl local_address rem_address st ... inode`: state 0A is LISTEN.
fn listening_tcp_port(table: &str, inodes: &HashSet<u64>) -> Option<u16> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
        let inode: u64 = fields.get(9)?.parse().ok()?;
        (*fields.get(3)? == "0A" && inodes.contains(&inode)).then_some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_listening_socket_of_the_process_only() {
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1111 /run/other.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 2222 /run/mysqld/mysqld.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 3333 /run/mysqld/mysqld.sock\n";
        let inodes: HashSet<u64> = [2222, 3333].into();
        assert_eq!(listening_unix_socket(unix, &inodes).as_deref(), Some("/run/mysqld/mysqld.sock"));
        assert_eq!(listening_unix_socket(unix, &[2222].into()), None, "a connected socket is not the listener");
    }

    #[test]
    fn finds_the_listening_port() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000   106        0 4444 1\n\
            1: 0100007F:0CEA 0100007F:D1A2 01 00000000:00000000 00:00000000 00000000   106        0 5555 1\n";
        assert_eq!(listening_tcp_port(tcp, &[4444, 5555].into()), Some(3306));
        assert_eq!(listening_tcp_port(tcp, &[5555].into()), None);
    }

    #[test]
    fn a_process_without_sockets_has_no_address() {
        assert_eq!(address_of(std::process::id()), None);
    }
}
