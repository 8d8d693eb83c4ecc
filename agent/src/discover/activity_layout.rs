//! Where a build keeps its connections, for reading what runs now from
//! the server's memory with no probe and no login:
//! - `server_threads` (exported) is a `THD_list` that starts with an
//!   intrusive `I_List<THD>`: a pointer to the first node, then the
//!   sentinel node itself. Each node is the `ilink` inside a THD, whose
//!   vtable pointer leads, by the C++ ABI, to the node's offset from its
//!   THD (offset-to-top) and to the type it belongs to (`typeinfo for
//!   THD`), so a node is proved to be a THD before it is read as one;
//! - `set_thd_stage_info` copies the old stage out before it stores the new
//!   one: `mov OFF(%rbx),%rax; mov %rax,0x8(%r12)` names `THD::proc_info`;
//! - `thd_kill_level` starts by loading `THD::killed`.
//!
//! A pattern that does not match leaves activity off for the build, with
//! the reason; it is never guessed.
use object::{Object, ObjectSegment, ObjectSymbol};

use super::{
    StaticVariable,
    elf::{find_symbol, function_bytes},
};

const SERVER_THREADS: &str = "server_threads";
const THD_TYPEINFO: &str = "_ZTI3THD";
const SET_THD_STAGE_INFO: &str = "set_thd_stage_info";
const THD_KILL_LEVEL: &str = "thd_kill_level";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivityLayout {
    /// `server_threads`: the list's first-node pointer, then its sentinel.
    pub threads: StaticVariable,
    /// `typeinfo for THD`: what every node's vtable must name.
    pub thd_typeinfo: StaticVariable,
    /// `THD::proc_info` (`const char*`): the server's stage.
    pub stage_offset: u32,
    /// `THD::killed` (a 32-bit `killed_state`).
    pub killed_offset: u32,
}

pub(super) fn activity_layout(elf: &object::File<'_>) -> Result<ActivityLayout, String> {
    let first = elf.segments().find(|s| s.file_range().0 == 0).ok_or("no segment maps the file's start")?;
    let first_segment = first.address() & !0xfff;
    let variable = |name: &str, kind: object::SymbolKind| {
        find_symbol(elf, name)
            .filter(|s| s.kind() == kind && s.size() >= 32)
            .map(|s| StaticVariable { address: s.address(), first_segment })
            .ok_or_else(|| format!("the binary exports no `{name}`"))
    };
    let threads = variable(SERVER_THREADS, object::SymbolKind::Data)?;
    let thd_typeinfo = variable(THD_TYPEINFO, object::SymbolKind::Data)?;
    let stage = function_bytes(elf, SET_THD_STAGE_INFO, 160).unwrap_or_default();
    let stage_offset = decode_stage(&stage)
        .ok_or_else(|| format!("`{SET_THD_STAGE_INFO}` does not match a known pattern (THD::proc_info)"))?;
    let kill = function_bytes(elf, THD_KILL_LEVEL, 112).unwrap_or_default();
    let killed_offset = decode_killed(&kill)
        .ok_or_else(|| format!("`{THD_KILL_LEVEL}` does not match a known pattern (THD::killed)"))?;
    Ok(ActivityLayout { threads, thd_typeinfo, stage_offset, killed_offset })
}

/// `mov OFF(%rbx),%rax; mov %rax,0x8(%r12)` (the old stage handed back),
/// confirmed by `mov %rsi,OFF(%rbx)` (the new one stored).
fn decode_stage(code: &[u8]) -> Option<u32> {
    let load = [0x48, 0x8b, 0x83];
    let hand_back = [0x49, 0x89, 0x44, 0x24, 0x08];
    let at = code.windows(12).position(|w| w[..3] == load && w[7..] == hand_back)?;
    let disp: [u8; 4] = code[at + 3..at + 7].try_into().ok()?;
    let store = [0x48, 0x89, 0xb3, disp[0], disp[1], disp[2], disp[3]];
    code.windows(store.len()).any(|w| w == store).then(|| u32::try_from(i32::from_le_bytes(disp)).ok())?
}

/// The first 32-bit load from `disp32(%rdi)` (`mov OFF(%rdi),%r12d` or
/// `%eax`), loaded again as `%eax` further on.
fn decode_killed(code: &[u8]) -> Option<u32> {
    let body = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
    let at = body.windows(6).position(|w| w[0] == 0x8b && w[1] & 0xc7 == 0x87)?;
    let disp: [u8; 4] = body[at + 2..at + 6].try_into().ok()?;
    let again = [0x8b, 0x87, disp[0], disp[1], disp[2], disp[3]];
    body[at + 6..].windows(6).any(|w| w == again).then(|| u32::try_from(i32::from_le_bytes(disp)).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_and_killed_from_10_11_code() {
        // set_thd_stage_info and thd_kill_level of Debian 12's 10.11.19.
        let stage = [
            0x8b, 0x83, 0x08, 0x26, 0, 0, 0x41, 0x89, 0x04, 0x24, 0x48, 0x8b, 0x83, 0x00, 0x26, 0, 0, 0x49, 0x89, 0x44,
            0x24, 0x08, 0x4d, 0x85, 0xff, 0x74, 0x3d, 0x41, 0x8b, 0x3f, 0x49, 0x8b, 0x77, 0x08, 0x48, 0x8b, 0x83, 0xd8,
            0x3b, 0, 0, 0x89, 0xbb, 0x08, 0x26, 0, 0, 0x48, 0x89, 0xb3, 0x00, 0x26, 0, 0,
        ];
        assert_eq!(decode_stage(&stage), Some(0x2600));
        let mut unconfirmed = stage;
        unconfirmed[50] = 0x27;
        assert_eq!(decode_stage(&unconfirmed), None);
        let kill = [
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83, 0xec, 0x18, 0x44, 0x8b, 0xa7, 0x9c, 0x3f, 0, 0, 0x45, 0x85,
            0xe4, 0x75, 0x1a, 0x8b, 0x87, 0x9c, 0x3f, 0, 0,
        ];
        assert_eq!(decode_killed(&kill), Some(0x3f9c));
        assert_eq!(decode_killed(&kill[..20]), None);
    }

    #[test]
    fn the_installed_server_decodes() {
        let Ok(bytes) = std::fs::read("/usr/sbin/mariadbd") else {
            return eprintln!("skipped: no /usr/sbin/mariadbd to read");
        };
        let elf = object::File::parse(&*bytes).unwrap();
        let layout = activity_layout(&elf).unwrap();
        assert!(layout.stage_offset > 0 && layout.killed_offset > layout.stage_offset);
    }
}
