/// An error and every cause under it, on one line (`a: b: c`): logs and
/// messages are read one line at a time, and the cause is usually the
/// part that says what to fix.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
