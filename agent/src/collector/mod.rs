//! The fleet collector (being written).
#[derive(clap::Args, Debug, Clone)]
pub struct CollectorArgs {}

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {}

pub fn main(_args: CollectorArgs) -> Result<(), CollectorError> {
    Ok(())
}
