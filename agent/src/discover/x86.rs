//! The few x86-64 instruction shapes the agent decodes from a server's
//! own machine code to learn where a build keeps a field: a load, a store,
//! an `or` or an `add` at a displacement from the first argument (`%rdi`,
//! the `THD*`), after the `endbr64` a protected build starts with.

/// The disp32 of the first instruction that starts with `prefix` (opcode
/// and a ModRM byte with a 32-bit displacement from %rdi or %rbx).
pub(super) fn find_disp(code: &[u8], prefix: &[u8]) -> Option<u32> {
    let at = code.windows(prefix.len()).position(|w| w == prefix)? + prefix.len();
    let disp = i32::from_le_bytes(code.get(at..at + 4)?.try_into().ok()?);
    u32::try_from(disp).ok()
}

/// `prefix disp32 imm32` with this immediate: `orq $imm, disp(%rdi)`.
pub(super) fn find_disp_imm32(code: &[u8], prefix: &[u8], imm: u32) -> Option<u32> {
    let mut from = 0;
    while let Some(at) = code.get(from..)?.windows(prefix.len()).position(|w| w == prefix) {
        let start = from + at + prefix.len();
        let disp = i32::from_le_bytes(code.get(start..start + 4)?.try_into().ok()?);
        let value = u32::from_le_bytes(code.get(start + 4..start + 8)?.try_into().ok()?);
        if value == imm {
            return u32::try_from(disp).ok();
        }
        from += at + 1;
    }
    None
}

/// `prefix disp32 imm8` with this immediate: `addq $1, disp(%rdi)`,
/// `orl $0x20, disp(%rdi)`.
pub(super) fn find_disp_imm8(code: &[u8], prefix: &[u8], imm: u8) -> Option<u32> {
    let mut from = 0;
    while let Some(at) = code.get(from..)?.windows(prefix.len()).position(|w| w == prefix) {
        let start = from + at + prefix.len();
        let disp = i32::from_le_bytes(code.get(start..start + 4)?.try_into().ok()?);
        if *code.get(start + 4)? == imm {
            return u32::try_from(disp).ok();
        }
        from += at + 1;
    }
    None
}

pub(super) fn strip_endbr(code: &[u8]) -> &[u8] {
    code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code)
}

/// `lea disp(%rdi),%rax; ret` -> disp.
pub(super) fn decode_lea_rdi(code: &[u8]) -> Option<u32> {
    decode_rdi_disp(strip_endbr(code), 0x8d)
}

/// `mov disp(%rdi),%rax; ret` -> disp.
pub(super) fn decode_mov_rdi(code: &[u8]) -> Option<u32> {
    decode_rdi_disp(strip_endbr(code), 0x8b)
}

/// `mov disp(%rdi),%eax; ret` (a 32-bit field) -> disp.
pub(super) fn decode_mov32_rdi(code: &[u8]) -> Option<u32> {
    match strip_endbr(code) {
        [0x8b, 0x47, disp, 0xc3, ..] => Some(*disp as u32),
        [0x8b, 0x87, a, b, c, d, 0xc3, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// `add %rsi,disp(%rdi); ret` -> disp.
pub(super) fn decode_add_rsi_to_rdi(code: &[u8]) -> Option<u32> {
    match strip_endbr(code) {
        // REX.W, add r/m64 r64, ModRM reg=rsi rm=rdi with disp8 or disp32
        [0x48, 0x01, 0x77, disp, 0xc3, ..] => Some(*disp as u32),
        [0x48, 0x01, 0xb7, a, b, c, d, 0xc3, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

fn decode_rdi_disp(code: &[u8], opcode: u8) -> Option<u32> {
    match code {
        // REX.W, opcode, ModRM mod=01 reg=rax rm=rdi, disp8, ret
        [0x48, op, 0x47, disp, 0xc3, ..] if *op == opcode => Some(*disp as u32),
        // REX.W, opcode, ModRM mod=10 reg=rax rm=rdi, disp32, ret
        [0x48, op, 0x87, a, b, c, d, 0xc3, ..] if *op == opcode => {
            let disp = i32::from_le_bytes([*a, *b, *c, *d]);
            u32::try_from(disp).ok()
        }
        _ => None,
    }
}
