use super::super::{digest, digest_text, lexer};

#[test]
fn scratch_print() {
    let input = std::fs::read_to_string("/tmp/scratch_sql.txt").unwrap_or_default();
    for line in input.lines().filter(|l| !l.trim().is_empty()) {
        let sp = lexer::tokenize_with_sqlparser(line).map(|t| digest::build(&t));
        let by = digest::build(&lexer::tokenize_bytes(line.as_bytes()));
        let mark = match &sp { Some(s) if *s != by => "DIFF", Some(_) => "ok  ", None => "BYTE" };
        println!("{mark} {line}\n     => {}", digest_text(line.as_bytes()));
        if let Some(s) = sp { if s != by { println!("     sp {s}\n     by {by}"); } }
    }
}
