//! The field an error names (`windows[2].digests[5].histogram`), spelled
//! out only when an error needs it: checking a batch of thousands of
//! digest rows would otherwise format a path for every field of every row.
use std::fmt;

#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    Root(&'static str),
    Field(&'a Path<'a>, &'static str),
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    pub(super) fn field(&'a self, name: &'static str) -> Path<'a> {
        Path::Field(self, name)
    }

    pub(super) fn index(&'a self, index: usize) -> Path<'a> {
        Path::Index(self, index)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root(name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Path;

    #[test]
    fn a_path_reads_as_the_field_it_names() {
        let windows = Path::Root("windows");
        let digest = windows.index(2);
        let digest = digest.field("digests");
        let digest = digest.index(5);
        assert_eq!(digest.field("histogram").to_string(), "windows[2].digests[5].histogram");
        assert_eq!(Path::Root("gaps").to_string(), "gaps");
    }
}
