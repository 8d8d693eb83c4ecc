//! Query tools against a collector (being written).
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {}
#[derive(clap::Args, Debug, Clone)]
pub struct InstancesArgs {}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {}

pub fn top(_args: TopArgs) -> Result<(), QueryError> {
    Ok(())
}

pub fn instances(_args: InstancesArgs) -> Result<(), QueryError> {
    Ok(())
}
