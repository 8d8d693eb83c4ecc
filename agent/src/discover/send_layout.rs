//! What the send hook (`--statement-hook send`) reads of a build: where
//! a thread keeps its THD, and where the THD says whether the statement is
//! answered. Each is decoded from the server's own exported code, as the
//! THD's other fields are, and a build whose code does not match is
//! refused with the function that did not (the uprobe still traces it).
use super::x86::strip_endbr;

/// `THD *_current_thd()`: loads the thread pointer (`%fs:0`) and reads
/// `THR_THD` below it.
pub(super) const CURRENT_THD: &str = "_current_thd";
/// `thd_get_error_number(THD*)`: reads `THD::m_stmt_da` first.
pub(super) const THD_GET_ERROR_NUMBER: &str = "thd_get_error_number";
/// `Diagnostics_area::set_eof_status(THD*)`: reads `m_status` first and
/// tests it against `DA_ERROR` and `DA_DISABLED`.
pub(super) const SET_EOF_STATUS: &str = "_ZN16Diagnostics_area14set_eof_statusEP3THD";

/// Where the send hook finds a statement's THD and its answer's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLayout {
    /// `THR_THD` lies this many bytes below the thread pointer.
    pub thd_tls_offset: u32,
    /// `THD::m_stmt_da`.
    pub stmt_da_offset: u32,
    /// `Diagnostics_area::m_status`.
    pub da_status_offset: u32,
}

/// The send layout from the code of the three functions above (`code`
/// gives a function's first bytes, empty when it is not exported), or
/// why this build has none.
pub fn send_layout(code: &dyn Fn(&'static str) -> Vec<u8>) -> Result<SendLayout, String> {
    let unmatched = |symbol: &str, code: &[u8]| {
        let bytes: Vec<String> = code.iter().take(24).map(|b| format!("{b:02x}")).collect();
        format!("the code of `{symbol}` does not match a known pattern (bytes {})", bytes.join(" "))
    };
    let current = code(CURRENT_THD);
    let thd_tls_offset = thread_local_offset(&current).ok_or_else(|| unmatched(CURRENT_THD, &current))?;
    let error_number = code(THD_GET_ERROR_NUMBER);
    let stmt_da_offset =
        first_load_from_rdi(&error_number, true).ok_or_else(|| unmatched(THD_GET_ERROR_NUMBER, &error_number))?;
    let eof = code(SET_EOF_STATUS);
    let da_status_offset = status_offset(&eof).ok_or_else(|| unmatched(SET_EOF_STATUS, &eof))?;
    Ok(SendLayout { thd_tls_offset, stmt_da_offset, da_status_offset })
}

/// `mov %fs:0x0,%rax` (any `data16` padding before it), then within a few
/// instructions `mov -disp(%rax),%rax`: the thread-local lies `disp` bytes
/// below the thread pointer, the executable's own TLS block.
fn thread_local_offset(code: &[u8]) -> Option<u32> {
    const FS_LOAD: [u8; 9] = [0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0];
    let after = code.windows(FS_LOAD.len()).position(|w| w == FS_LOAD)? + FS_LOAD.len();
    // Only a `pop %rbp` may come between (a frame-pointer build).
    let rest = code.get(after..)?;
    let rest = rest.strip_prefix(&[0x5d]).unwrap_or(rest);
    let disp = match rest {
        [0x48, 0x8b, 0x40, disp, ..] => i64::from(*disp as i8),
        [0x48, 0x8b, 0x80, a, b, c, d, ..] => i64::from(i32::from_le_bytes([*a, *b, *c, *d])),
        _ => return None,
    };
    // Below the thread pointer, 8-byte aligned, within a TLS block's size.
    (disp < 0 && disp % 8 == 0 && -disp <= 1 << 20).then(|| (-disp) as u32)
}

/// The displacement of the function's first instruction when it loads
/// from `%rdi` into `%rax` (64-bit) or `%eax` (32-bit).
fn first_load_from_rdi(code: &[u8], wide: bool) -> Option<u32> {
    let code = strip_endbr(code);
    let code = if wide { code.strip_prefix(&[0x48])? } else { code };
    match code {
        [0x8b, 0x47, disp, ..] => Some(u32::from(*disp)).filter(|d| *d < 0x80),
        [0x8b, 0x87, a, b, c, d, ..] => u32::try_from(i32::from_le_bytes([*a, *b, *c, *d])).ok(),
        _ => None,
    }
}

/// `mov disp(%rdi),%eax` and then `lea -0x5(%rax),%edx; cmp $0x1,%edx`:
/// the status, tested for `DA_ERROR` (5) or `DA_DISABLED` (6). The test
/// pins the enum's values, which the program relies on: OK 1 to ERROR 5
/// answer a statement.
fn status_offset(code: &[u8]) -> Option<u32> {
    const ERROR_OR_DISABLED: [u8; 6] = [0x8d, 0x50, 0xfb, 0x83, 0xfa, 0x01];
    let offset = first_load_from_rdi(code, false)?;
    code.windows(ERROR_OR_DISABLED.len()).any(|w| w == ERROR_OR_DISABLED).then_some(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three functions as MariaDB 10.11.19 (Debian 12) compiles them.
    fn debian_10_11(symbol: &'static str) -> Vec<u8> {
        match symbol {
            CURRENT_THD => vec![
                0x55, 0x48, 0x89, 0xe5, 0x66, 0x66, 0x66, 0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x5d, 0x48, 0x8b,
                0x40, 0x98, 0xc3,
            ],
            THD_GET_ERROR_NUMBER => vec![0x48, 0x8b, 0x87, 0xe0, 0x62, 0, 0, 0x8b, 0x40, 0x08, 0xc3],
            SET_EOF_STATUS => {
                vec![0x8b, 0x87, 0x34, 0x02, 0, 0, 0x8d, 0x50, 0xfb, 0x83, 0xfa, 0x01, 0x77, 0x02, 0xc3]
            }
            _ => Vec::new(),
        }
    }

    #[test]
    fn decodes_what_debian_builds() {
        assert_eq!(
            send_layout(&debian_10_11),
            Ok(SendLayout { thd_tls_offset: 0x68, stmt_da_offset: 0x62e0, da_status_offset: 0x234 })
        );
    }

    #[test]
    fn a_status_test_against_other_values_is_refused() {
        let other = |symbol| {
            let mut code = debian_10_11(symbol);
            if symbol == SET_EOF_STATUS {
                code[8] = 0xfc; // lea -0x4: another enum
            }
            code
        };
        let why = send_layout(&other).unwrap_err();
        assert!(why.contains(SET_EOF_STATUS), "{why}");
    }

    #[test]
    fn a_build_without_the_accessor_says_so() {
        let without = |symbol| if symbol == CURRENT_THD { Vec::new() } else { debian_10_11(symbol) };
        let why = send_layout(&without).unwrap_err();
        assert!(why.contains("_current_thd"), "{why}");
    }

    #[test]
    fn a_thread_local_above_the_thread_pointer_is_refused() {
        let code = [0x64, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0, 0x48, 0x8b, 0x40, 0x10, 0xc3];
        assert_eq!(thread_local_offset(&code), None);
    }
}
