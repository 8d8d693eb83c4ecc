//! Finds MySQL/MariaDB servers on this host and learns, per binary, where to
//! probe and how to read the server's own structures.
//!
//! Binaries are reached through `/proc/PID/root` so a server in another
//! container (mount namespace) is read from its own filesystem. Nothing here
//! touches the server; it only reads procfs and ELF files.
mod activity_layout;
mod apply_layout;
mod binary;
mod clients;
mod connect_attrs;
mod elf;
mod kernel_btf;
mod process;
mod send_layout;
mod sock_diag;
mod thd_fields;
mod uprobe_links;
mod x86;

pub use activity_layout::ActivityLayout;
pub use apply_layout::{ApplyLayout, EventClass};
pub use binary::{
    BinaryIdentity, BinaryInfo, Flavor, ProbePoint, ProbePoints, ProgramLayout, StaticVariable, ValueDecoder,
    ValueType, identify_binary, inspect_binary,
};
pub use clients::{Client, Connection as ClientConnection, Resolver as ClientResolver, resolve as resolve_clients};
pub use connect_attrs::{AttrAsker, AttrReader, ConnectAttrs};
pub use kernel_btf::{
    BtfError, has_current_task_btf, running_kernel_at_least, task_fsbase_offset, task_runtime_offset,
};
pub use process::{
    Container, ServerProcess, cpu_seconds, find_servers, runtime_address, server_by_pid, threads_cpu_ns,
};
pub use send_layout::SendLayout;
pub use thd_fields::keep_only as keep_statement_fields;
pub use uprobe_links::multi_links;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("no process with pid {pid}: check the --pid value (is the server running?)")]
    NoSuchProcess { pid: u32 },
    #[error("cannot read {path}: {source}")]
    Proc {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read server binary {path}: {source}{}", binary_hint(source))]
    Binary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an ELF file sqlbee can read: {reason}")]
    NotElf { path: PathBuf, reason: String },
    #[error(
        "{path} has no symbol `{symbol}` ({what}); sqlbee needs it to trace statements. \
         Is this a mysqld/mariadbd binary? Stripped builds keep it in .dynsym; \
         a build without it cannot be traced"
    )]
    MissingSymbol { path: PathBuf, symbol: &'static str, what: &'static str },
    #[error("{path} looks like {flavor}: {detail}. sqlbee supports MariaDB 10.x/11.x binaries today")]
    Unsupported { path: PathBuf, flavor: &'static str, detail: String },
    #[error(
        "could not learn {field} from `{symbol}` in {path}: its code does not match a known \
         pattern (bytes {bytes}); refusing to guess an offset"
    )]
    UnknownLayout { path: PathBuf, field: &'static str, symbol: &'static str, bytes: String },
}

/// What to do about a binary the agent may not read.
fn binary_hint(source: &std::io::Error) -> &'static str {
    match source.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (the agent reads a server's binary through /proc/PID/exe, which takes CAP_SYS_PTRACE when the \
             server runs as another user or in another container; see the manual's page \"Privileges the \
             agent keeps\")"
        }
        std::io::ErrorKind::NotFound => " (the process has exited, or is not a program with a binary)",
        _ => "",
    }
}
