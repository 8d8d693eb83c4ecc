//! Every connection of a server, read from its memory: the walk of
//! `server_threads` and the fields of each THD (see
//! `discover::ActivityLayout` for how the list is proved to hold THDs).
//!
//! The server changes the list while it is read: a node freed under the
//! walk fails a read, or no longer names `typeinfo for THD`, and ends the
//! walk early (the snapshot then says it is partial); a field read from a
//! THD being torn down is at worst one stale line in one snapshot.
use std::collections::HashMap;

use sqlbee_kernel_abi::{ServerLayout, UNKNOWN, stats_field, thd_field};

use super::memory::{Memory, le_u32, le_u64};
use crate::discover::ActivityLayout;

/// Connections read per server, at most.
pub const MAX_CONNECTIONS: usize = 100_000;
/// Bytes of a running statement read: enough for its digest and sample.
pub const TEXT_READ: usize = 4096;

/// One THD as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawConnection {
    pub thread_id: u64,
    pub command: u32,
    /// CLOCK_MONOTONIC microseconds at which its statement started.
    pub start_utime: u64,
    pub text: Vec<u8>,
    pub schema: Option<String>,
    pub user: Option<String>,
    pub host: Option<String>,
    pub stage: Option<String>,
    pub killed: bool,
    pub in_transaction: bool,
    pub system: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    #[error("cannot read the server's connection list (server_threads) from its memory")]
    List,
    #[error(
        "a connection list node does not name `typeinfo for THD` (offset-to-top {offset}): \
         this build's layout is not the one sqlbee reads; activity is off for it"
    )]
    NotThd { offset: i64 },
}

/// What a walk read, and whether the list changed under it.
pub struct Walk {
    pub connections: Vec<RawConnection>,
    /// The walk stopped early (a node freed while it was read).
    pub partial: bool,
}

/// Reads one server's connections. `vtables` remembers the vtable
/// addresses already proved to be THD's (and their offset-to-top).
pub struct ThreadReader {
    memory: Memory,
    layout: ServerLayout,
    activity: ActivityLayout,
    /// Run-time addresses.
    list: u64,
    typeinfo: u64,
    vtables: HashMap<u64, i64>,
    /// Stage strings are the server's constants: read once each.
    stages: HashMap<u64, String>,
}

impl ThreadReader {
    pub fn new(pid: u32, layout: ServerLayout, activity: ActivityLayout) -> Option<ThreadReader> {
        let list = crate::discover::runtime_address(pid, activity.threads)?;
        let typeinfo = crate::discover::runtime_address(pid, activity.thd_typeinfo)?;
        Some(ThreadReader {
            memory: Memory::of(pid),
            layout,
            activity,
            list,
            typeinfo,
            vtables: HashMap::new(),
            stages: HashMap::new(),
        })
    }

    pub fn read(&mut self) -> Result<Walk, ReadError> {
        let sentinel = self.list + 8;
        let mut node = self.memory.u64(self.list).ok_or(ReadError::List)?;
        let mut connections = Vec::new();
        let mut partial = false;
        while node != sentinel {
            if connections.len() >= MAX_CONNECTIONS {
                partial = true;
                break;
            }
            // vptr, prev, next.
            let Some(link) = self.memory.gather(&[(node, 24)]) else {
                partial = true;
                break;
            };
            let thd = match self.thd_of(node, le_u64(&link, 0)) {
                Ok(Some(thd)) => thd,
                Ok(None) => {
                    partial = true;
                    break;
                }
                Err(e) => return Err(e),
            };
            if let Some(connection) = self.connection(thd) {
                connections.push(connection);
            }
            node = le_u64(&link, 16);
        }
        Ok(Walk { connections, partial })
    }

    /// The THD a node belongs to. The first vtable is proved once; a node
    /// with another vtable that does not name THD is a node freed under
    /// the walk (None), unless no node was ever proved (the build's
    /// layout is not the one read: an error).
    fn thd_of(&mut self, node: u64, vptr: u64) -> Result<Option<u64>, ReadError> {
        if let Some(offset) = self.vtables.get(&vptr) {
            return Ok(Some(node.wrapping_add_signed(*offset)));
        }
        let Some(header) = self.memory.gather(&[(vptr.wrapping_sub(16), 16)]) else {
            return if self.vtables.is_empty() { Err(ReadError::NotThd { offset: 0 }) } else { Ok(None) };
        };
        let offset = le_u64(&header, 0) as i64;
        if le_u64(&header, 8) != self.typeinfo || !(-0x10000..=0).contains(&offset) {
            return if self.vtables.is_empty() { Err(ReadError::NotThd { offset }) } else { Ok(None) };
        }
        // A few vtables at most (THD's own); bounded all the same.
        if self.vtables.len() < 16 {
            self.vtables.insert(vptr, offset);
        }
        Ok(Some(node.wrapping_add_signed(offset)))
    }

    fn connection(&mut self, thd: u64) -> Option<RawConnection> {
        let l = &self.layout;
        let a = &self.activity;
        let has = |bit: u32| l.stats_fields & bit != 0;
        let mut spans = vec![
            (thd + u64::from(l.connection_id_offset), 8),
            (thd + u64::from(l.command_offset), 4),
            (thd + u64::from(l.start_utime_offset), 8),
            (thd + u64::from(l.query_offset), 16),
            (thd + u64::from(a.stage_offset), 8),
            (thd + u64::from(a.killed_offset), 4),
        ];
        let optional = [
            (l.db_offset != UNKNOWN, l.db_offset as u64, 16),
            (l.sctx_offset != UNKNOWN, l.sctx_offset as u64, 8),
            (has(stats_field::SERVER_STATUS), u64::from(l.field_at[thd_field::SERVER_STATUS]), 4),
            (has(stats_field::SYSTEM_THREAD), u64::from(l.field_at[thd_field::SYSTEM_THREAD]), 4),
        ];
        for (present, offset, len) in optional {
            spans.push(if present { (thd + offset, len) } else { (thd, 0) });
        }
        let fields = self.memory.gather(&spans)?;
        let mut at = 0;
        let mut next = |len: usize| {
            let start = at;
            at += len;
            start
        };
        let thread_id = le_u64(&fields, next(8));
        let command = le_u32(&fields, next(4));
        let start_utime = le_u64(&fields, next(8));
        let query = next(16);
        let (text_ptr, text_len) = (le_u64(&fields, query), le_u64(&fields, query + 8));
        let stage_ptr = le_u64(&fields, next(8));
        let killed = le_u32(&fields, next(4)) != 0;
        let db = if l.db_offset != UNKNOWN { Some(next(16)) } else { None };
        let sctx = if l.sctx_offset != UNKNOWN { Some(le_u64(&fields, next(8))) } else { None };
        let status = has(stats_field::SERVER_STATUS).then(|| le_u32(&fields, next(4)));
        let system = has(stats_field::SYSTEM_THREAD).then(|| le_u32(&fields, next(4)));

        let text = if text_ptr != 0 && text_len > 0 {
            self.memory.gather(&[(text_ptr, (text_len as usize).min(TEXT_READ))]).unwrap_or_default()
        } else {
            Vec::new()
        };
        let schema = db.and_then(|at| {
            let (ptr, len) = (le_u64(&fields, at), le_u64(&fields, at + 8));
            (ptr != 0 && len > 0 && len <= 256).then(|| self.memory.gather(&[(ptr, len as usize)])).flatten()
        });
        let (user, host) = match sctx.filter(|p| *p != 0) {
            Some(sctx) => {
                let names = self
                    .memory
                    .gather(&[(sctx + u64::from(l.sctx_user_offset), 8), (sctx + u64::from(l.sctx_host_offset), 8)]);
                match names {
                    Some(names) => {
                        (self.memory.c_string(le_u64(&names, 0), 256), self.memory.c_string(le_u64(&names, 8), 256))
                    }
                    None => (None, None),
                }
            }
            None => (None, None),
        };
        let stage = self.stage(stage_ptr);
        let lossy = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Some(RawConnection {
            thread_id,
            command,
            start_utime,
            text,
            schema: schema.map(lossy),
            user: user.map(lossy),
            host: host.map(lossy),
            stage,
            killed,
            // SERVER_STATUS_IN_TRANS.
            in_transaction: status.is_some_and(|s| s & 1 != 0),
            system: system.is_some_and(|s| s != 0),
        })
    }

    fn stage(&mut self, ptr: u64) -> Option<String> {
        if ptr == 0 {
            return None;
        }
        if let Some(stage) = self.stages.get(&ptr) {
            return Some(stage.clone());
        }
        let stage = String::from_utf8_lossy(&self.memory.c_string(ptr, 128)?).into_owned();
        // The server's stages are a few hundred constants.
        if self.stages.len() < 4096 {
            self.stages.insert(ptr, stage.clone());
        }
        Some(stage)
    }
}
