//! Symbols and code of an ELF file, for the modules that decode a build.
use object::{Object, ObjectSection, ObjectSymbol};

pub fn find_symbol<'d, 'f>(elf: &'f object::File<'d>, name: &str) -> Option<object::Symbol<'d, 'f>> {
    elf.dynamic_symbols().chain(elf.symbols()).find(|s| s.is_definition() && s.name() == Ok(name))
}

pub fn function_bytes(elf: &object::File<'_>, name: &str, len: u64) -> Option<Vec<u8>> {
    let symbol = find_symbol(elf, name)?;
    let section = elf.section_by_index(symbol.section_index()?).ok()?;
    let bytes = section.data_range(symbol.address(), len).ok()??;
    Some(bytes.to_vec())
}
