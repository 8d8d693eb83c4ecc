//! Who is at the other end of a server connection's socket: its address,
//! and for a client on this node, its process and container. Read once per
//! connection, off the statement path, from the socket the server holds:
//! the agent takes its own copy of the fd (`pidfd_getfd`, which its
//! CAP_SYS_PTRACE allows), asks it for the peer (`getpeername`, or
//! `SO_PEERCRED` for a unix socket) and closes it. A TCP peer on this node
//! is found by its socket in the server's network namespace (`sock_diag`)
//! and the process holding that socket.
use std::{
    collections::HashMap,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    time::{Duration, Instant},
};

use super::{
    process::{Container, container_of},
    sock_diag,
};

/// A client as the server's node can see it; each part `None` where it
/// cannot be known (a remote client has only an address).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// The peer's IP address (no port); `None` for a unix socket.
    pub address: Option<String>,
    /// The client process's executable name and pid, as this node's pid
    /// namespace numbers it.
    pub process: Option<String>,
    pub pid: Option<u32>,
    /// Its container (named as instances are), and the Kubernetes pod and
    /// namespace where the runtime says so.
    pub container: Option<String>,
    pub container_id: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    /// What the client said it is at connect (its connection attributes,
    /// read with the login): the program's name, its client library and
    /// version, and its pid on its own host.
    pub program: Option<String>,
    pub driver: Option<String>,
    pub client_pid: Option<u32>,
}

impl Client {
    /// True when nothing at all is known.
    pub fn is_unknown(&self) -> bool {
        *self == Self::default()
    }
}

/// One connection to name: the server's fd for its socket.
#[derive(Clone, Copy, Debug)]
pub struct Connection {
    pub server_pid: u32,
    pub socket_fd: i32,
}

/// Names clients, remembering what makes the next ones cheap: the
/// processes that held loopback clients' sockets before (an application
/// server opens many connections), looked through first, and when every
/// process was last scanned.
#[derive(Default)]
pub struct Resolver {
    /// Most recent last; at most `KNOWN_OWNERS`.
    owners: Vec<u32>,
    last_scan: Option<Instant>,
}

/// Processes remembered as loopback clients.
const KNOWN_OWNERS: usize = 64;
/// A scan of every process's fds (milliseconds on a busy node) runs at
/// most this often; a loopback client found in none of the remembered
/// processes meanwhile is named by its address alone.
const SCAN_EVERY: Duration = Duration::from_secs(1);

impl Resolver {
    /// Names the clients of `connections` (in that order); a connection
    /// whose socket is gone, or is not a socket, is an unknown client.
    /// Reads each network table at most once per call.
    pub fn resolve(&mut self, connections: &[Connection]) -> Vec<Client> {
        let mut tables: HashMap<u32, Vec<TcpEntry>> = HashMap::new();
        let mut out = Vec::with_capacity(connections.len());
        for c in connections {
            let client = match peer_of(*c) {
                None => Client::default(),
                Some(Peer::Unix { pid }) => local_client(pid, None),
                Some(Peer::Tcp { local, remote }) => {
                    // The client's end in the server's network namespace:
                    // a socket whose local end is the server's peer. Asked
                    // of the kernel when that is the agent's namespace, else
                    // read from the server's table.
                    let inode = if same_network(c.server_pid) {
                        sock_diag::tcp_inode(remote, local)
                    } else {
                        let table = tables.entry(c.server_pid).or_insert_with(|| tcp_table(c.server_pid));
                        table.iter().find(|e| e.local == remote && e.remote == local).map(|e| e.inode)
                    };
                    match inode.and_then(|inode| self.owner_of(inode)) {
                        Some(pid) => local_client(pid, Some(address(remote.ip()))),
                        None => Client { address: Some(address(remote.ip())), ..Client::default() },
                    }
                }
            };
            out.push(client);
        }
        out
    }

    /// The process holding socket `inode`: among the remembered ones, else
    /// by a scan of every process (at most once per `SCAN_EVERY`).
    fn owner_of(&mut self, inode: u64) -> Option<u32> {
        let found = self.owners.iter().rev().copied().find(|pid| holds(*pid, inode)).or_else(|| {
            if self.last_scan.is_some_and(|at| at.elapsed() < SCAN_EVERY) {
                return None;
            }
            self.last_scan = Some(Instant::now());
            socket_owners().remove(&inode)
        })?;
        self.owners.retain(|pid| *pid != found);
        if self.owners.len() >= KNOWN_OWNERS {
            self.owners.remove(0);
        }
        self.owners.push(found);
        Some(found)
    }
}

/// Whether the server's network namespace is the agent's.
fn same_network(server_pid: u32) -> bool {
    let ns = |path: &str| fs::read_link(path).ok();
    ns("/proc/self/ns/net").is_some_and(|own| ns(&format!("/proc/{server_pid}/ns/net")) == Some(own))
}

/// One call with a fresh `Resolver`.
pub fn resolve(connections: &[Connection]) -> Vec<Client> {
    Resolver::default().resolve(connections)
}

/// Whether process `pid` holds socket `inode`.
fn holds(pid: u32, inode: u64) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| fs::read_link(fd.path()).is_ok_and(|t| socket_inode(&t) == Some(inode)))
}

fn socket_inode(target: &Path) -> Option<u64> {
    target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// An address as a DBA writes it: an IPv4 peer mapped into IPv6 as IPv4.
fn address(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or_else(|| v6.to_string(), |v4| v4.to_string()),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

enum Peer {
    Unix { pid: u32 },
    Tcp { local: SocketAddr, remote: SocketAddr },
}

/// The peer of the server's socket `fd`, through a copy of the fd.
fn peer_of(c: Connection) -> Option<Peer> {
    if c.socket_fd < 0 {
        return None;
    }
    // SAFETY: plain syscalls; each fd returned is owned and closed here.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, c.server_pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return None;
    }
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), c.socket_fd, 0) };
    if fd < 0 {
        return None;
    }
    let socket = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let fd = socket.as_raw_fd();
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let ok = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, (&mut domain as *mut libc::c_int).cast(), &mut len)
    };
    if ok != 0 {
        return None;
    }
    match domain {
        libc::AF_UNIX => {
            let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
            let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
            let ok = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_PEERCRED,
                    (&mut cred as *mut libc::ucred).cast(),
                    &mut len,
                )
            };
            (ok == 0 && cred.pid > 0).then_some(Peer::Unix { pid: cred.pid as u32 })
        }
        libc::AF_INET | libc::AF_INET6 => {
            let local = socket_address(fd, libc::getsockname)?;
            let remote = socket_address(fd, libc::getpeername)?;
            Some(Peer::Tcp { local, remote })
        }
        _ => None,
    }
}

type NameCall = unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

fn socket_address(fd: i32, call: NameCall) -> Option<SocketAddr> {
    // SAFETY: a zeroed sockaddr_storage is valid, and the call writes at
    // most `len` bytes of it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    if unsafe { call(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return None;
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says which sockaddr it is.
            let v4: libc::sockaddr_in = unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(v4.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above.
            let v6: libc::sockaddr_in6 = unsafe { std::ptr::read((&storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(v6.sin6_port)))
        }
        _ => None,
    }
}

#[derive(Debug, PartialEq)]
struct TcpEntry {
    local: SocketAddr,
    remote: SocketAddr,
    inode: u64,
}

/// The TCP sockets of the server's network namespace (IPv4 and IPv6).
fn tcp_table(server_pid: u32) -> Vec<TcpEntry> {
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(format!("/proc/{server_pid}/net/{t}")).ok())
        .flat_map(|text| text.lines().skip(1).filter_map(parse_tcp_line).collect::<Vec<_>>())
        .collect()
}

/// One line of /proc/net/tcp{,6}: `sl local rem st ... uid timeout inode`.
fn parse_tcp_line(line: &str) -> Option<TcpEntry> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    Some(TcpEntry {
        local: parse_hex_address(fields.get(1)?)?,
        remote: parse_hex_address(fields.get(2)?)?,
        inode: fields.get(9)?.parse().ok()?,
    })
}

/// `0100007F:0CEA` (IPv4) or 32 hex digits (IPv6): the address's 32-bit
/// words in host order, then the port.
fn parse_hex_address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok().map(u32::from_be);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?.to_be_bytes())),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?.to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Socket inode -> a process holding it, over every process this agent can
/// see.
fn socket_owners() -> HashMap<u64, u32> {
    let mut owners = HashMap::new();
    let Ok(processes) = fs::read_dir("/proc") else { return owners };
    for pid in processes.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else { continue };
            if let Some(inode) = socket_inode(&target) {
                owners.entry(inode).or_insert(pid);
            }
        }
    }
    owners
}

/// A client process on this node, with its container and pod.
fn local_client(pid: u32, address: Option<String>) -> Client {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let process = fs::read_link(proc_dir.join("exe"))
        .ok()
        .and_then(|exe| Some(exe.file_name()?.to_string_lossy().into_owned()))
        .map(|name| name.strip_suffix(" (deleted)").map(str::to_string).unwrap_or(name))
        .or_else(|| fs::read_to_string(proc_dir.join("comm")).ok().map(|c| c.trim_end().to_string()));
    let Some(process) = process else {
        // Gone already: only what the socket said.
        return Client { address, ..Client::default() };
    };
    let container = container_of(&proc_dir);
    let kubernetes = fs::read_to_string(proc_dir.join("cgroup")).is_ok_and(|c| c.contains("kubepods"));
    let (pod, namespace) = match &container {
        Some(Container { name, .. }) if kubernetes => {
            (name.split('/').next().map(str::to_string), pod_namespace(&proc_dir))
        }
        _ => (None, None),
    };
    Client {
        address,
        process: Some(process),
        pid: Some(pid),
        container: container.as_ref().map(|c| c.name.clone()),
        container_id: container.map(|c| c.id),
        pod,
        namespace,
        ..Client::default()
    }
}

/// A pod's namespace, as Kubernetes mounts it in every container with a
/// service account (most; none where `automountServiceAccountToken` is
/// off).
fn pod_namespace(proc_dir: &Path) -> Option<String> {
    let text = fs::read_to_string(proc_dir.join("root/var/run/secrets/kubernetes.io/serviceaccount/namespace")).ok()?;
    let namespace = text.trim();
    // A DNS label: what a namespace may be named.
    (!namespace.is_empty()
        && namespace.len() <= 63
        && namespace.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    .then(|| namespace.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_table_lines_parse() {
        let v4 =
            "   1: 0100007F:0CEA 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000   106        0 123456 1 0";
        let entry = parse_tcp_line(v4).unwrap();
        assert_eq!(entry.local, "127.0.0.1:3306".parse().unwrap());
        assert_eq!(entry.remote, "127.0.0.1:53924".parse().unwrap());
        assert_eq!(entry.inode, 123456);
        let v6 = "   0: 00000000000000000000000001000000:0CEA 0000000000000000FFFF00000100007F:D2A4 01 00000000:00000000 00:00000000 00000000 106 0 77 1 0";
        let entry = parse_tcp_line(v6).unwrap();
        assert_eq!(entry.local, "[::1]:3306".parse().unwrap());
        assert_eq!(address(entry.remote.ip()), "127.0.0.1");
        assert!(parse_tcp_line("  sl  local_address rem_address").is_none());
    }

    #[test]
    fn a_unix_socket_peer_is_this_process() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = ours.as_raw_fd();
        let client = resolve(&[Connection { server_pid: std::process::id(), socket_fd: fd }]).remove(0);
        assert_eq!(client.pid, Some(std::process::id()));
        assert!(client.process.is_some() && client.address.is_none());
    }

    #[test]
    fn a_remembered_owner_is_looked_through_before_any_scan() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut resolver = Resolver::default();
        let mut name = || {
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server_end, _) = listener.accept().unwrap();
            let named =
                resolver.resolve(&[Connection { server_pid: std::process::id(), socket_fd: server_end.as_raw_fd() }]);
            drop(client);
            named.into_iter().next().unwrap()
        };
        // The first scans every process; the second, within the scan
        // interval, finds this process among those it remembers.
        assert_eq!(name().pid, Some(std::process::id()));
        assert_eq!(name().pid, Some(std::process::id()));
    }

    #[test]
    fn a_loopback_tcp_peer_is_found_by_its_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_end, _) = listener.accept().unwrap();
        let client =
            resolve(&[Connection { server_pid: std::process::id(), socket_fd: server_end.as_raw_fd() }]).remove(0);
        assert_eq!(client.address.as_deref(), Some("127.0.0.1"));
        assert_eq!(client.pid, Some(std::process::id()));
        assert!(resolve(&[Connection { server_pid: std::process::id(), socket_fd: 9999 }])[0].is_unknown());
    }
}
