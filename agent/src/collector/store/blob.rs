//! Compact BLOB encoding of (key, count) pairs with strictly increasing
//! keys: histogram buckets and error codes. Each pair is two LEB128
//! varints, the key as the gap from the previous key. A typical histogram
//! of 10-20 buckets takes 20-40 bytes instead of 496 counters.

pub fn encode(pairs: impl IntoIterator<Item = (u64, u64)>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous = 0u64;
    for (key, count) in pairs {
        varint(&mut out, key.wrapping_sub(previous));
        varint(&mut out, count);
        previous = key;
    }
    out
}

/// Decodes what `encode` wrote; None when the bytes are not such a list.
pub fn decode(mut bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    let mut pairs = Vec::new();
    let mut previous = 0u64;
    while !bytes.is_empty() {
        let gap = read_varint(&mut bytes)?;
        let count = read_varint(&mut bytes)?;
        previous = previous.checked_add(gap)?;
        pairs.push((previous, count));
    }
    Some(pairs)
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let pairs = vec![(0, 1), (3, 127), (40, 128), (495, u64::MAX), (u64::MAX, 0)];
        assert_eq!(decode(&encode(pairs.clone())).unwrap(), pairs);
        assert_eq!(decode(&encode([])).unwrap(), vec![]);
        assert_eq!(encode([(40, 1), (41, 2)]).len(), 4);
    }

    #[test]
    fn refuses_garbage() {
        assert!(decode(&[0x80]).is_none());
        assert!(decode(&[1]).is_none());
        assert!(decode(&[0xff; 11]).is_none());
    }
}
