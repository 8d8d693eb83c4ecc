//! Where a statement's end is seen: the choice of `--statement-hook`.
use clap::ValueEnum;
use serde::Deserialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementHook {
    /// A uprobe at `log_slow_statement`: every statement, stored programs'
    /// and the replica's applier's included, at one trap per statement.
    #[default]
    Uprobe,
    /// Experimental: the server's answer to a client, seen at the `sendto`
    /// (or, under TLS, `write`) that carries it, with no trap in the
    /// server. Only statements clients send over a socket are counted;
    /// the program runs at every syscall on the host.
    Send,
}
