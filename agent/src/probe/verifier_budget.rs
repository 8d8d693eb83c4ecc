//! What every kernel's verifier will count for each program of the
//! object, worked out from the object alone: the stack its worst call
//! chain needs and the instructions it loads.
//!
//! A kernel refuses a program whose call chain (subprograms and the
//! `bpf_loop` callbacks it passes, each frame rounded up) needs more than
//! 512 bytes of stack. Kernels with private stacks (6.13 and later, when
//! the JIT uses them) accept more, so a program that loads here may still
//! be refused on Debian's 6.1 or 6.12; this module is how the tests find
//! that out before a kernel does, whatever the kernel they run on allows.
//!
//! A frame's size is the deepest stack byte its instructions reach: an
//! access through `r10` and a pointer made from `r10` (`rX = r10; rX +=
//! -N`), which is how LLVM passes a stack object to a helper or callee.
//! That is what the verifier charges a frame when every path touches its
//! deepest slot, and never less. Each frame is rounded the way the
//! strictest kernels round it (6.1: up to 32 bytes, and at least 32).
use std::collections::{BTreeMap, BTreeSet};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionFlags, SymbolKind};

const INSN: usize = 8;
const STACK_REG: u8 = 10;
/// `src_reg` of a call to a subprogram, and of an `ld_imm64` of a
/// function's address (a callback).
const PSEUDO_CALL: u8 = 1;
const PSEUDO_FUNC: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("the eBPF object does not parse: {0}")]
    Parse(#[from] object::Error),
    #[error("`{function}`: instruction {at} {what}")]
    Call { function: String, at: usize, what: String },
    #[error("`{0}` calls itself through its callees; BPF allows no recursion")]
    Recursion(String),
}

/// One program: its worst chain, frame by frame (function name and the
/// stack the verifier charges it), and what it loads.
#[derive(Clone, Debug)]
pub struct ProgramBudget {
    pub name: String,
    pub section: String,
    /// The deepest chain of frames, outermost first.
    pub chain: Vec<(String, u32)>,
    /// The program's instructions and those of every subprogram it reaches
    /// (each once, as the loader appends them).
    pub instructions: usize,
}

impl ProgramBudget {
    /// Bytes of stack the worst chain needs.
    pub fn stack(&self) -> u32 {
        self.chain.iter().map(|(_, bytes)| bytes).sum()
    }

    /// The chain as the verifier would print it, `a 32 + b 448 = 480`.
    pub fn describe(&self) -> String {
        let frames: Vec<String> = self.chain.iter().map(|(name, bytes)| format!("{} {bytes}", short(name))).collect();
        format!("{} = {}", frames.join(" + "), self.stack())
    }
}

/// A demangled name's last two path segments (`statements::try_statement_end`).
fn short(name: &str) -> String {
    let demangled = rustc_demangle_lite(name);
    let parts: Vec<&str> = demangled.rsplitn(3, "::").collect();
    match parts.as_slice() {
        [last, module, _] | [last, module] => format!("{module}::{last}"),
        _ => demangled,
    }
}

/// Just enough of v0 demangling for `_RNvNtCs..._10agent_ebpf10statements17try_statement_end`:
/// the identifiers, joined by `::`.
fn rustc_demangle_lite(name: &str) -> String {
    let Some(rest) = name.strip_prefix("_R") else { return name.to_owned() };
    let bytes = rest.as_bytes();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            // A crate root's disambiguator (`Cs<base62>_`) holds digits
            // that are no lengths.
            b's' if i > 0 && bytes[i - 1] == b'C' => {
                while i < bytes.len() && bytes[i] != b'_' {
                    i += 1;
                }
                i += 1;
            }
            b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let Ok(len) = rest[start..i].parse::<usize>() else { break };
                let Some(ident) = rest.get(i..i + len) else { break };
                parts.push(ident);
                i += len;
            }
            _ => i += 1,
        }
    }
    if parts.is_empty() { name.to_owned() } else { parts.join("::") }
}

/// What the verifier charges a frame of `depth` bytes on the strictest
/// kernels: rounded up to 32, and at least 32.
pub fn charged(depth: u32) -> u32 {
    depth.max(1).div_ceil(32) * 32
}

#[derive(Clone, Debug)]
struct Function {
    name: String,
    section: object::SectionIndex,
    start: usize,
    end: usize,
}

/// Every program of `elf` (functions in sections other than `.text`).
pub fn programs(elf: &[u8]) -> Result<Vec<ProgramBudget>, BudgetError> {
    let file = object::File::parse(elf)?;
    let mut functions: Vec<Function> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            Some(Function {
                name: s.name().ok()?.to_owned(),
                section: s.section_index()?,
                start: s.address() as usize,
                end: (s.address() + s.size()) as usize,
            })
        })
        .collect();
    functions.sort_by_key(|f| (f.section.0, f.start));
    let find =
        |section: object::SectionIndex, at: usize| functions.iter().position(|f| f.section == section && f.start == at);

    // Per function: its own frame's depth and what it calls or passes as
    // a callback.
    let mut depth = vec![0u32; functions.len()];
    let mut callees: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); functions.len()];
    for (index, function) in functions.iter().enumerate() {
        let section = file.section_by_index(function.section)?;
        let SectionFlags::Elf { sh_flags } = section.flags() else { continue };
        if sh_flags & u64::from(object::elf::SHF_EXECINSTR) == 0 {
            continue;
        }
        let data = section.data()?;
        let relocations: BTreeMap<u64, RelocationTarget> =
            section.relocations().map(|(offset, r)| (offset, r.target())).collect();
        let code = data.get(function.start..function.end).ok_or_else(|| BudgetError::Call {
            function: function.name.clone(),
            at: 0,
            what: "lies outside its section".into(),
        })?;
        let scan = scan(code)?;
        depth[index] = scan.depth;
        for (at, kind, imm) in scan.references {
            let offset = function.start + at * INSN;
            let error = |what: String| BudgetError::Call { function: function.name.clone(), at, what };
            let (target_section, target) = match relocations.get(&(offset as u64)) {
                Some(RelocationTarget::Symbol(symbol)) => {
                    let symbol = file.symbol_by_index(*symbol)?;
                    let section = symbol.section_index();
                    let in_code = match section {
                        Some(section) => is_executable(&file.section_by_index(section)?),
                        None => false,
                    };
                    let base = symbol.address() as i64;
                    // A call's immediate counts instructions after it; an
                    // address's counts bytes.
                    match (kind, section) {
                        (Reference::Address { .. }, _) if !in_code => continue,
                        (Reference::Address { .. }, Some(section)) => (section, base + i64::from(imm)),
                        (Reference::Call, Some(section)) => (section, base + (i64::from(imm) + 1) * INSN as i64),
                        (_, None) => {
                            let name = symbol.name().unwrap_or("?");
                            return Err(error(format!("refers to `{name}`, defined nowhere")));
                        }
                    }
                }
                Some(other) => return Err(error(format!("has a relocation of an unknown kind ({other:?})"))),
                None if matches!(kind, Reference::Address { pseudo_func: false }) => continue,
                None => (function.section, offset as i64 + (i64::from(imm) + 1) * INSN as i64),
            };
            let callee = usize::try_from(target)
                .ok()
                .and_then(|t| find(target_section, t))
                .ok_or_else(|| error(format!("calls byte {target}, where no function starts")))?;
            callees[index].insert(callee);
        }
    }

    let mut out = Vec::new();
    for (index, function) in functions.iter().enumerate() {
        let section = file.section_by_index(function.section)?;
        let section_name = section.name()?.to_owned();
        if section_name == ".text" || !is_executable(&section) {
            continue;
        }
        let chain = worst_chain(index, &depth, &callees, &functions, &mut Vec::new())?;
        let mut reached = BTreeSet::new();
        reach(index, &callees, &mut reached);
        let instructions = reached.iter().map(|&f| (functions[f].end - functions[f].start) / INSN).sum();
        out.push(ProgramBudget { name: function.name.clone(), section: section_name, chain, instructions });
    }
    Ok(out)
}

fn is_executable(section: &object::Section<'_, '_>) -> bool {
    matches!(section.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
}

fn reach(index: usize, callees: &[BTreeSet<usize>], reached: &mut BTreeSet<usize>) {
    if reached.insert(index) {
        for &callee in &callees[index] {
            reach(callee, callees, reached);
        }
    }
}

/// The deepest chain from `index` down, as (name, charged bytes).
fn worst_chain(
    index: usize,
    depth: &[u32],
    callees: &[BTreeSet<usize>],
    functions: &[Function],
    path: &mut Vec<usize>,
) -> Result<Vec<(String, u32)>, BudgetError> {
    if path.contains(&index) {
        return Err(BudgetError::Recursion(functions[index].name.clone()));
    }
    path.push(index);
    let mut deepest: Vec<(String, u32)> = Vec::new();
    for &callee in &callees[index] {
        let chain = worst_chain(callee, depth, callees, functions, path)?;
        let bytes: u32 = chain.iter().map(|(_, b)| b).sum();
        if bytes > deepest.iter().map(|(_, b)| b).sum() {
            deepest = chain;
        }
    }
    path.pop();
    let mut chain = vec![(functions[index].name.clone(), charged(depth[index]))];
    chain.extend(deepest);
    Ok(chain)
}

#[derive(Clone, Copy, Debug)]
enum Reference {
    Call,
    /// An `ld_imm64`: a function's address when it is relocated against
    /// code or marked so, else a map or a constant.
    Address {
        pseudo_func: bool,
    },
}

struct Scan {
    depth: u32,
    /// (instruction index, kind, immediate) of each subprogram call and
    /// callback address.
    references: Vec<(usize, Reference, i32)>,
}

/// One function's instructions: the deepest stack byte they reach, and
/// the functions they call or take the address of.
///
/// Registers that hold `r10 + k` are followed in instruction order. LLVM
/// makes such a pointer right where it uses it; a pointer whose offset
/// this cannot follow (a branch in between) is still charged at the
/// deepest offset it was ever seen with, which can only overstate.
fn scan(code: &[u8]) -> Result<Scan, BudgetError> {
    let mut depth: i64 = 0;
    let mut frame_pointers: [Option<i64>; 11] = [None; 11];
    let mut references = Vec::new();
    let mut i = 0;
    let count = code.len() / INSN;
    while i < count {
        let insn = &code[i * INSN..(i + 1) * INSN];
        let opcode = insn[0];
        let dst = (insn[1] & 0x0f) as usize;
        let src = insn[1] >> 4;
        let off = i64::from(i16::from_le_bytes([insn[2], insn[3]]));
        let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        let class = opcode & 0x07;
        let mut reach = |offset: i64| depth = depth.max(-offset);
        match class {
            // ld_imm64 takes two slots.
            0x00 if opcode == 0x18 => {
                // LLVM leaves `src_reg` 0 and relocates against the
                // function's section; the loader marks it a callback then.
                references.push((i, Reference::Address { pseudo_func: src == PSEUDO_FUNC }, imm));
                if dst < 11 {
                    frame_pointers[dst] = None;
                }
                i += 2;
                continue;
            }
            // LDX: dst = *(src + off)
            0x01 => {
                if let Some(base) = frame_pointers.get(src as usize).copied().flatten() {
                    reach(base + off);
                }
                if dst < 11 {
                    frame_pointers[dst] = None;
                }
            }
            // ST / STX: *(dst + off) = ...
            0x02 | 0x03 => {
                if let Some(base) = frame_pointers.get(dst).copied().flatten() {
                    reach(base + off);
                }
                // Atomic fetch forms write a register back.
                if class == 0x03 && opcode & 0xe0 == 0xc0 && imm & 0x01 != 0 && (src as usize) < 11 {
                    frame_pointers[src as usize] = None;
                }
            }
            0x05 | 0x06 => {
                if opcode == 0x85 {
                    if src == PSEUDO_CALL {
                        references.push((i, Reference::Call, imm));
                    }
                    // Calls clobber r0-r5.
                    frame_pointers[..6].fill(None);
                }
            }
            // ALU64
            0x07 => {
                let op = opcode & 0xf0;
                let from_reg = opcode & 0x08 != 0;
                match (op, from_reg) {
                    // mov rX, rY
                    (0xb0, true) => {
                        frame_pointers[dst] = frame_pointers.get(src as usize).copied().flatten();
                    }
                    // add rX, imm / sub rX, imm
                    (0x00, false) | (0x10, false) => {
                        let delta = if op == 0x00 { i64::from(imm) } else { -i64::from(imm) };
                        if let Some(base) = frame_pointers[dst] {
                            let at = base + delta;
                            frame_pointers[dst] = Some(at);
                            reach(at);
                        }
                    }
                    _ => {
                        if dst < 11 && dst != STACK_REG as usize {
                            frame_pointers[dst] = None;
                        }
                    }
                }
            }
            // 32-bit ALU: the register no longer holds a pointer.
            0x04 if dst < 11 && dst != STACK_REG as usize => frame_pointers[dst] = None,
            _ => {}
        }
        // r10 is the frame pointer itself.
        frame_pointers[STACK_REG as usize] = Some(0);
        i += 1;
    }
    Ok(Scan { depth: u32::try_from(depth).unwrap_or(u32::MAX), references })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_charged_as_the_strictest_kernels_charge_them() {
        assert_eq!(charged(0), 32);
        assert_eq!(charged(8), 32);
        assert_eq!(charged(48), 64);
        assert_eq!(charged(480), 480);
        assert_eq!(charged(481), 512);
    }

    fn insn(opcode: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[0] = opcode;
        out[1] = dst | (src << 4);
        out[2..4].copy_from_slice(&off.to_le_bytes());
        out[4..8].copy_from_slice(&imm.to_le_bytes());
        out
    }

    #[test]
    fn a_frame_is_as_deep_as_its_deepest_access_or_pointer() {
        let code: Vec<u8> = [
            // *(u64 *)(r10 - 16) = r1
            insn(0x7b, 10, 1, -16, 0),
            // r2 = r10; r2 += -200 (a stack object passed to a helper)
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, -200),
            // call helper 112 (clobbers r2)
            insn(0x85, 0, 0, 0, 112),
            // r2 += -400: r2 is no stack pointer any more
            insn(0x07, 2, 0, 0, -400),
            // r3 = r10; *(u32 *)(r3 - 260) = 0
            insn(0xbf, 3, 10, 0, 0),
            insn(0x62, 3, 0, -260, 0),
            insn(0x95, 0, 0, 0, 0),
        ]
        .concat();
        let scan = scan(&code).expect("scans");
        assert_eq!(scan.depth, 260);
        assert!(scan.references.is_empty());
    }

    #[test]
    fn calls_and_callbacks_are_found() {
        let code: Vec<u8> = [
            insn(0x85, 0, PSEUDO_CALL, 0, 3),
            insn(0x18, 2, PSEUDO_FUNC, 0, 5),
            insn(0x00, 0, 0, 0, 0),
            insn(0x95, 0, 0, 0, 0),
        ]
        .concat();
        let scan = scan(&code).expect("scans");
        let kinds: Vec<String> = scan.references.iter().map(|(at, kind, imm)| format!("{at} {kind:?} {imm}")).collect();
        assert_eq!(kinds, ["0 Call 3", "1 Address { pseudo_func: true } 5"]);
    }

    #[test]
    fn names_are_shortened_to_module_and_function() {
        assert_eq!(
            short("_RNvNtCsdCUhdhIOX7j_10agent_ebpf10statements17try_statement_end"),
            "statements::try_statement_end"
        );
        assert_eq!(short("statement_end"), "statement_end");
    }

    /// What every program's worst chain may use: 512 bytes on every
    /// kernel, less a margin for what a compiler update adds unseen.
    const HEADROOM: u32 = 448;
    /// Instructions a program may load (subprograms included). The
    /// verifier's own limit is far higher; what it walks grows with what it
    /// loads, and a restarted server waits for that walk to be traced again.
    const MAX_INSTRUCTIONS: usize = 4_096;

    #[test]
    fn every_program_fits_every_kernels_stack_with_headroom() {
        let budgets = programs(super::super::attach::EBPF_OBJECT).expect("the object analyzes");
        let names: Vec<&str> = budgets.iter().map(|b| b.name.as_str()).collect();
        for (program, perf) in super::super::link_mode::PROGRAMS {
            assert!(names.contains(&program), "{program} not found in the object: {names:?}");
            if let Some(perf) = perf {
                assert!(names.contains(&perf), "{perf} not found in the object: {names:?}");
            }
        }
        let mut over = Vec::new();
        for budget in &budgets {
            println!(
                "{:22} {:13} {:5} instructions, stack {}",
                budget.name,
                budget.section,
                budget.instructions,
                budget.describe()
            );
            if budget.stack() > HEADROOM {
                over.push(format!("{}: stack {} > {HEADROOM}", budget.name, budget.describe()));
            }
            if budget.instructions > MAX_INSTRUCTIONS {
                over.push(format!("{}: {} instructions > {MAX_INSTRUCTIONS}", budget.name, budget.instructions));
            }
        }
        assert!(
            over.is_empty(),
            "programs past the budget every kernel allows (move large locals to per-CPU scratch maps, or split \
             the program): {over:#?}"
        );
        // The frames that once went past 512 bytes are still seen: a
        // scan that found no stack would pass everything.
        let statement_end = budgets.iter().find(|b| b.name == "statement_end").expect("statement_end");
        assert!(statement_end.chain.len() >= 3 && statement_end.stack() >= 256, "{}", statement_end.describe());
    }
}
