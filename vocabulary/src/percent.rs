//! Percent-encoding as sqlcommenter tags and W3C baggage (which the
//! `OTEL_EXPORTER_OTLP_HEADERS` variable uses) write it.

/// `%XX` escapes decoded; None for a broken escape or bytes that are not
/// UTF-8 once decoded.
pub fn decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_decode_and_broken_ones_are_refused() {
        assert_eq!(super::decode("a%20b%3D").as_deref(), Some("a b="));
        assert_eq!(super::decode("plain").as_deref(), Some("plain"));
        assert_eq!(super::decode("bad%zz"), None);
        assert_eq!(super::decode("cut%2"), None);
        assert_eq!(super::decode("%ff"), None, "not UTF-8");
    }
}
