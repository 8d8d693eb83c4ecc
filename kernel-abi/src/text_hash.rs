//! The text hash of the kernel digests: FNV-1a over the statement text
//! with the values of number and single-quoted string literals left out,
//! so `WHERE id=5` and `WHERE id=6` hash alike.
//!
//! The one rule that matters: two texts with equal hashes must get equal
//! digests from the agent's normalizer. Leaving out too little only costs
//! a second slot for the same digest; leaving out too much would merge two
//! digests. So whatever is not certainly a literal value is hashed as it
//! is: double-quoted strings (identifiers under ANSI_QUOTES), backquoted
//! identifiers, comments (executable ones run), digits inside words
//! (`t1`, `2events`, `0x1F`) and after `.`, `@` or `?` (`t.5`, `@1`, `?1`).
//! What is skipped must be read as the normalizer (and MariaDB) reads it:
//! a quote opens a string wherever MariaDB's lexer says so, so `--` starts
//! a comment only before a space or a control character, as there. The
//! agent also checks one fresh sample per hash and window against its
//! digest.
//!
//! Pure and bounded per byte: the kernel runs [`step`] from `bpf_loop`.

/// Where the lexer is between two bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashState {
    pub hash: u64,
    /// Hash of the digits of the number being skipped: mixed in after all
    /// when a word character follows (`2events`, `1e5`).
    pub number: u64,
    pub mode: u32,
    /// The previous byte, 0 at the start.
    pub prev: u32,
}

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

mod mode {
    pub const CODE: u32 = 0;
    pub const NUMBER: u32 = 1;
    pub const STRING: u32 = 2;
    pub const STRING_ESCAPE: u32 = 3;
    pub const DOUBLE_QUOTED: u32 = 4;
    pub const DOUBLE_QUOTED_ESCAPE: u32 = 5;
    pub const BACKQUOTED: u32 = 6;
    pub const LINE_COMMENT: u32 = 7;
    pub const BLOCK_COMMENT: u32 = 8;
    /// A number past its decimal point: another `.` ends it.
    pub const FRACTION: u32 = 9;
    /// After `--`: a comment if a space or a control character follows.
    pub const DASH_DASH: u32 = 10;
}

impl HashState {
    pub const fn new() -> Self {
        Self { hash: crate::kernel_digests::HASH_SEED, number: 0, mode: mode::CODE, prev: 0 }
    }

    /// The hash of everything stepped so far; never 0 (0 means "no hash").
    pub fn finish(&self) -> u64 {
        let in_number = self.mode == mode::NUMBER || self.mode == mode::FRACTION;
        let hash = if in_number { mix(self.hash, b'0') } else { self.hash };
        if hash == 0 { 1 } else { hash }
    }
}

impl Default for HashState {
    fn default() -> Self {
        Self::new()
    }
}

#[inline(always)]
fn mix(hash: u64, byte: u8) -> u64 {
    (hash ^ byte as u64).wrapping_mul(FNV_PRIME)
}

#[inline(always)]
fn is_word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'$' || byte >= 0x80
}

/// Feeds one byte.
#[inline(always)]
pub fn step(s: &mut HashState, byte: u8) {
    let prev = s.prev as u8;
    s.prev = byte as u32;
    match s.mode {
        mode::NUMBER | mode::FRACTION => {
            if byte.is_ascii_digit() || (byte == b'.' && s.mode == mode::NUMBER) {
                if byte == b'.' {
                    s.mode = mode::FRACTION;
                }
                s.number = mix(s.number, byte);
                return;
            }
            s.hash = mix(s.hash, b'0');
            // A number that ends at its point (`1.` in `1..10`, `0.`x``)
            // reads differently from one with a fraction followed by a
            // point (`1.5.10`, `7.5.`x``), which hashes `0` `.`: it hashes
            // `0` `0`, which nothing else does (a number is never followed
            // by a digit).
            if s.mode == mode::FRACTION && prev == b'.' {
                s.hash = mix(s.hash, b'0');
            }
            // The skipped digits were not a number on their own: keep them.
            if is_word(byte) {
                s.hash ^= s.number;
                s.hash = s.hash.wrapping_mul(FNV_PRIME);
            }
            s.mode = mode::CODE;
            code(s, prev, byte);
        }
        mode::CODE => code(s, prev, byte),
        mode::STRING => {
            if byte == b'\\' {
                s.mode = mode::STRING_ESCAPE;
            } else if byte == b'\'' {
                s.hash = mix(s.hash, byte);
                s.mode = mode::CODE;
            }
        }
        mode::STRING_ESCAPE => s.mode = mode::STRING,
        mode::DOUBLE_QUOTED => {
            s.hash = mix(s.hash, byte);
            if byte == b'\\' {
                s.mode = mode::DOUBLE_QUOTED_ESCAPE;
            } else if byte == b'"' {
                s.mode = mode::CODE;
            }
        }
        mode::DOUBLE_QUOTED_ESCAPE => {
            s.hash = mix(s.hash, byte);
            s.mode = mode::DOUBLE_QUOTED;
        }
        mode::BACKQUOTED => {
            s.hash = mix(s.hash, byte);
            if byte == b'`' {
                s.mode = mode::CODE;
            }
        }
        mode::DASH_DASH => {
            // As in MariaDB: `--'` is code, and its quote opens a string.
            if byte <= b' ' || byte == 0x7f {
                s.hash = mix(s.hash, byte);
                s.mode = if byte == b'\n' { mode::CODE } else { mode::LINE_COMMENT };
            } else {
                s.mode = mode::CODE;
                code(s, prev, byte);
            }
        }
        mode::LINE_COMMENT => {
            s.hash = mix(s.hash, byte);
            if byte == b'\n' {
                s.mode = mode::CODE;
            }
        }
        _ => {
            s.hash = mix(s.hash, byte);
            if byte == b'/' && prev == b'*' {
                s.mode = mode::CODE;
            }
        }
    }
}

#[inline(always)]
fn code(s: &mut HashState, prev: u8, byte: u8) {
    if byte.is_ascii_digit() && !is_word(prev) && !matches!(prev, b'.' | b'@' | b'?') {
        s.number = mix(crate::kernel_digests::HASH_SEED, byte);
        s.mode = mode::NUMBER;
        return;
    }
    s.hash = mix(s.hash, byte);
    s.mode = match byte {
        b'\'' => mode::STRING,
        b'"' => mode::DOUBLE_QUOTED,
        b'`' => mode::BACKQUOTED,
        b'#' => mode::LINE_COMMENT,
        b'-' if prev == b'-' => mode::DASH_DASH,
        b'*' if prev == b'/' => {
            // `/*/` does not close the comment it opens.
            s.prev = 0;
            mode::BLOCK_COMMENT
        }
        _ => mode::CODE,
    };
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` equal to `byte` (non-zero exactly
/// when one is).
#[inline(always)]
const fn bytes_equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * byte as u64);
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// Non-zero when a byte of `word` is one the lexer must see one by one in
/// code: a digit may start a number, the rest a string, an identifier or
/// a comment. Every other byte is mixed in and leaves the lexer in code.
#[inline(always)]
const fn code_stops(word: u64) -> u64 {
    let t = word ^ (ONES * b'0' as u64);
    let digits = t.wrapping_sub(ONES * 10) & !t & HIGHS;
    digits
        | bytes_equal(word, b'\'')
        | bytes_equal(word, b'"')
        | bytes_equal(word, b'`')
        | bytes_equal(word, b'#')
        | bytes_equal(word, b'-')
        | bytes_equal(word, b'*')
}

/// Feeds the next eight bytes at once when the lexer, in code, would only
/// mix each in: `word` holds them (little-endian), of which the first
/// `left` are the text's. Returns 8 when it fed them, 0 when the next byte
/// must go through [`step`]; the state afterwards is exactly what stepping
/// them one by one leaves. Eight or none: feeding fewer would branch per
/// byte, and every branch multiplies what the verifier walks. (Skipping
/// through string literals the same way cost another 0.6 s of
/// verification at attach, and was left out.)
#[inline(always)]
pub fn run(s: &mut HashState, word: u64, left: u64) -> u64 {
    if s.mode != mode::CODE || code_stops(word) != 0 || left < 8 {
        return 0;
    }
    for j in 0..8 {
        s.hash = mix(s.hash, (word >> (8 * j)) as u8);
    }
    s.prev = (word >> 56) as u32;
    8
}

/// The hash of a whole text by [`run`] and [`step`], as the kernel feeds
/// it; equal to [`hash`] for every text.
pub fn hash_by_runs(text: &[u8]) -> u64 {
    let mut s = HashState::new();
    let mut at = 0;
    while at < text.len() {
        let mut word = [0u8; 8];
        let n = (text.len() - at).min(8);
        word[..n].copy_from_slice(&text[at..at + n]);
        let fed = run(&mut s, u64::from_le_bytes(word), n as u64) as usize;
        if fed == 0 {
            step(&mut s, text[at]);
            at += 1;
        } else {
            at += fed;
        }
    }
    s.finish()
}

/// The hash of a whole text (the agent's tests; the kernel steps itself).
pub fn hash(text: &[u8]) -> u64 {
    let mut s = HashState::new();
    for &b in text {
        step(&mut s, b);
    }
    s.finish()
}
