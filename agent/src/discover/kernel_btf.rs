//! Where the running kernel keeps a task's CPU time: the offset of
//! `se.sum_exec_runtime` in `struct task_struct`, read from the kernel's
//! own BTF (`/sys/kernel/btf/vmlinux`), the same description CO-RE
//! relocations use. The statement program reads that one field of the
//! current task, so the offset is all it needs.
//!
//! Only what that needs of the BTF format is parsed here: the header, the
//! string section and the type records, walked in order to find two
//! structs by name and a member of each.
use std::path::Path;

const MAGIC: u16 = 0xeb9f;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read the kernel's BTF at {path}: {source} (CPU time per statement needs a kernel with BTF)")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel's BTF is malformed: {0}")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no {0}")]
    Missing(&'static str),
}

/// Offset of `task_struct.se.sum_exec_runtime` in bytes.
pub fn task_runtime_offset(path: &Path) -> Result<u32, BtfError> {
    task_field_offset(path, ("se", "sum_exec_runtime"), "task_struct.se.sum_exec_runtime")
}

/// Offset of `task_struct.thread.fsbase` in bytes: the x86-64 thread
/// pointer of the task's user space, below which a program's thread-locals
/// lie (the send hook reads the server's THD there).
pub fn task_fsbase_offset(path: &Path) -> Result<u32, BtfError> {
    task_field_offset(path, ("thread", "fsbase"), "task_struct.thread.fsbase")
}

/// Offset of the aligned u64 `task_struct.OUTER.INNER` in bytes.
fn task_field_offset(path: &Path, (outer, inner): (&str, &str), what: &'static str) -> Result<u32, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.display().to_string(), source })?;
    let btf = Btf::parse(&data)?;
    let task = btf.struct_named("task_struct").ok_or(BtfError::Missing("struct task_struct"))?;
    let (outer_bits, outer_type) = btf.member(task, outer).ok_or(BtfError::Missing(what))?;
    let outer_struct = btf.resolve(outer_type).ok_or(BtfError::Missing(what))?;
    let (inner_bits, _) = btf.member(outer_struct, inner).ok_or(BtfError::Missing(what))?;
    let bits = outer_bits + inner_bits;
    if bits % 64 != 0 {
        return Err(BtfError::Malformed("the task's field is not an aligned 64-bit field"));
    }
    u32::try_from(bits / 8).map_err(|_| BtfError::Malformed("offset out of range"))
}

/// Whether the running kernel has `bpf_get_current_task_btf` (5.11 and
/// later), through which the statement program reads the task's CPU time
/// with a plain load instead of a helper call: 0.1 us less per statement
/// on the 2-vCPU VM of `benches/results`. An unreadable release counts as
/// without.
pub fn has_current_task_btf() -> bool {
    running_kernel_at_least((5, 11))
}

/// Whether the running kernel's release is `wanted` (major, minor) or
/// later; an unreadable release counts as older.
pub fn running_kernel_at_least(wanted: (u32, u32)) -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|release| release_at_least(&release, wanted))
}

/// `6.18.44-fc` >= (5, 11): the leading major.minor of a kernel release.
fn release_at_least(release: &str, wanted: (u32, u32)) -> bool {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(major), Some(minor)) if (major, minor) >= wanted)
}

/// One type record: where it starts, its kind, name, member count and the
/// type it refers to (typedefs and qualifiers).
#[derive(Clone, Copy)]
struct Type {
    at: usize,
    kind: u32,
    kind_flag: bool,
    name: u32,
    vlen: usize,
    refers: u32,
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Type records by id (id 0 is `void` and has none).
    index: Vec<Type>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let bad = BtfError::Malformed;
        let magic =
            u16::from_le_bytes(data.get(0..2).ok_or(bad("short header"))?.try_into().map_err(|_| bad("header"))?);
        if magic != MAGIC {
            return Err(bad("bad magic (a big-endian or non-BTF file?)"));
        }
        let header_len = u32_at(data, 4).ok_or(bad("short header"))? as usize;
        let field = |i: usize| u32_at(data, 8 + 4 * i).map(|v| v as usize).ok_or(bad("short header"));
        let (type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let section = |off: usize, len: usize| {
            let start = header_len.checked_add(off).ok_or(bad("section offset"))?;
            data.get(start..start.checked_add(len).ok_or(bad("section length"))?).ok_or(bad("section past the end"))
        };
        let types = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;
        let mut index = vec![Type { at: 0, kind: 0, kind_flag: false, name: 0, vlen: 0, refers: 0 }];
        let mut at = 0;
        while at < types.len() {
            let name = u32_at(types, at).ok_or(bad("truncated type"))?;
            let info = u32_at(types, at + 4).ok_or(bad("truncated type"))?;
            let refers = u32_at(types, at + 8).ok_or(bad("truncated type"))?;
            let (vlen, kind, kind_flag) = ((info & 0xffff) as usize, (info >> 24) & 0x1f, info >> 31 == 1);
            let extra = match kind {
                1 | 14 | 17 => 4,             // int, var, decl tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func proto
                2 | 7..=12 | 16 | 18 => 0,    // ptr, fwd, typedef, qualifiers, func, float, type tag
                _ => return Err(bad("unknown type kind")),
            };
            index.push(Type { at, kind, kind_flag, name, vlen, refers });
            at += 12 + extra;
        }
        Ok(Btf { types, strings, index })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
    }

    fn struct_named(&self, name: &str) -> Option<Type> {
        self.index.iter().copied().find(|t| t.kind == KIND_STRUCT && t.vlen > 0 && self.name(t.name) == name.as_bytes())
    }

    /// The struct or union a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<Type> {
        for _ in 0..32 {
            let t = *self.index.get(id as usize)?;
            match t.kind {
                KIND_STRUCT | KIND_UNION => return Some(t),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.refers,
                _ => return None,
            }
        }
        None
    }

    /// A member's bit offset and type id. Members of anonymous structs and
    /// unions inside are searched too, their offsets added.
    fn member(&self, within: Type, name: &str) -> Option<(u64, u32)> {
        self.member_at_depth(within, name, 0)
    }

    fn member_at_depth(&self, within: Type, name: &str, depth: u32) -> Option<(u64, u32)> {
        if depth > 8 {
            return None;
        }
        for i in 0..within.vlen {
            let at = within.at + 12 + 12 * i;
            let member_name = u32_at(self.types, at)?;
            let member_type = u32_at(self.types, at + 4)?;
            let raw = u32_at(self.types, at + 8)?;
            // With kind_flag, the top 8 bits are a bitfield's size.
            let bits = u64::from(if within.kind_flag { raw & 0x00ff_ffff } else { raw });
            if self.name(member_name) == name.as_bytes() {
                return Some((bits, member_type));
            }
            if member_name == 0
                && let Some(inner) = self.resolve(member_type)
                && let Some((inner_bits, id)) = self.member_at_depth(inner, name, depth + 1)
            {
                return Some((bits + inner_bits, id));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_release_decides_the_btf_task_pointer() {
        assert!(release_at_least("6.18.44-fc-v669", (5, 11)));
        assert!(release_at_least("5.11.0", (5, 11)));
        assert!(!release_at_least("5.10.209-1-lts", (5, 11)));
        assert!(!release_at_least("4.18.0-513.el8.x86_64", (5, 11)));
        assert!(!release_at_least("garbage", (5, 11)));
        assert!(!release_at_least("", (5, 11)));
    }

    /// A BTF blob with `struct inner { u64 a; u64 sum_exec_runtime; }`
    /// behind a typedef, inside `struct task_struct { u32 pad[..]; inner se; }`
    /// at byte 24 (through an anonymous union for good measure).
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0inner\0a\0sum_exec_runtime\0task_struct\0se\0pad\0inner_t\0".to_vec();
        let at = |s: &str| {
            strings.windows(s.len() + 1).position(|w| &w[1..] == s.as_bytes() && w[0] == 0).unwrap() as u32 + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend_from_slice(&w.to_le_bytes()));
        // 1: int (8 bytes)
        push(&[at("int"), 1 << 24, 8, 64]);
        // 2: struct inner { a @0, sum_exec_runtime @64 }
        push(&[at("inner"), (4 << 24) | 2, 16, at("a"), 1, 0, at("sum_exec_runtime"), 1, 64]);
        // 3: typedef inner_t -> 2
        push(&[at("inner_t"), 8 << 24, 2]);
        // 4: anonymous union { inner_t se @0 }
        push(&[0, (5 << 24) | 1, 16, at("se"), 3, 0]);
        // 5: struct task_struct { int pad @0; int pad @64; anon union @192 }
        push(&[at("task_struct"), (4 << 24) | 3, 40, at("pad"), 1, 0, at("pad"), 1, 64, 0, 4, 192]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            data.extend_from_slice(&v.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(&strings);
        data
    }

    #[test]
    fn finds_the_runtime_through_typedefs_and_anonymous_members() {
        let dir = std::env::temp_dir().join(format!("sqlbee-btf-{}", std::process::id()));
        std::fs::write(&dir, blob()).unwrap();
        let offset = task_runtime_offset(&dir);
        std::fs::remove_file(&dir).ok();
        assert_eq!(offset.unwrap(), 24 + 8);
    }

    #[test]
    fn malformed_btf_is_an_error_not_a_panic() {
        let data = blob();
        for cut in [0, 3, 10, 30, data.len() - 5] {
            assert!(Btf::parse(&data[..cut]).is_err(), "cut at {cut}");
        }
        let mut wrong = data.clone();
        wrong[0] = 0;
        assert!(matches!(Btf::parse(&wrong), Err(BtfError::Malformed(_))));
    }

    /// The running kernel's own BTF, where there is one: an offset inside
    /// task_struct, 8-byte aligned.
    #[test]
    fn reads_the_running_kernels_btf() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            eprintln!("skipped: this kernel has no BTF at {}", path.display());
            return;
        }
        let offset = task_runtime_offset(path).unwrap();
        assert!(offset % 8 == 0 && offset > 0 && offset < 64 * 1024, "{offset}");
        let fsbase = task_fsbase_offset(path).unwrap();
        assert!(fsbase % 8 == 0 && fsbase > 0 && fsbase < 64 * 1024 && fsbase != offset, "{fsbase}");
    }
}
