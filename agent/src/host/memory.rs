//! Memory from /proc/meminfo.

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryInfo {
    pub total_bytes: u64,
    /// The kernel's estimate of what can be allocated without swapping;
    /// absent before Linux 3.14.
    pub available_bytes: Option<u64>,
    pub free_bytes: u64,
    pub buffers_bytes: u64,
    pub cached_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
}

/// The memory figures and the number of lines skipped, or `None` without
/// `MemTotal` (then this is not /proc/meminfo).
pub(super) fn parse_meminfo(text: &str) -> Option<(MemoryInfo, u64)> {
    let mut info = MemoryInfo::default();
    let mut total = None;
    let mut skipped = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((key, bytes)) = parse_line(line) else {
            skipped += 1;
            continue;
        };
        match key {
            "MemTotal" => total = Some(bytes),
            "MemAvailable" => info.available_bytes = Some(bytes),
            "MemFree" => info.free_bytes = bytes,
            "Buffers" => info.buffers_bytes = bytes,
            "Cached" => info.cached_bytes = bytes,
            "SwapTotal" => info.swap_total_bytes = bytes,
            "SwapFree" => info.swap_free_bytes = bytes,
            _ => {}
        }
    }
    info.total_bytes = total?;
    Some((info, skipped))
}

/// `Key:   1234 kB`, or a bare count such as `HugePages_Total:  0`.
fn parse_line(line: &str) -> Option<(&str, u64)> {
    let (key, rest) = line.split_once(':')?;
    let mut fields = rest.split_whitespace();
    let value: u64 = fields.next()?.parse().ok()?;
    let bytes = match fields.next() {
        None => value,
        Some("kB") => value.checked_mul(1024)?,
        Some(_) => return None,
    };
    Some((key.trim(), bytes))
}
