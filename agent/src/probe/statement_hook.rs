//! Where a statement's end is seen: the choice of `--statement-hook`.
use clap::ValueEnum;
use serde::Deserialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StatementHook {
    /// A uprobe at `log_slow_statement`: every statement, stored programs'
    /// and the replica's applier's included, at one trap per statement.
    #[default]
    Uprobe,
    /// Experimental: the server's answer to a client, seen at the `sendto`
    /// (or, under TLS, `write`) that carries it, with no trap in the
    /// server. Only statements clients send over a socket are counted.
    /// The program sits on the `syscalls` tracepoints of those two calls,
    /// or, without tracefs, on the raw one of every syscall.
    Send,
    /// `send` on the raw `sys_enter` tracepoint even where tracefs is
    /// there: no tracefs and no perf event, a program run at every syscall
    /// on the host.
    SendRaw,
}

impl StatementHook {
    pub fn at_send(self) -> bool {
        self != StatementHook::Uprobe
    }
}
