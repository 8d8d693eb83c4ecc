//! The agent's Prometheus page (`agent_metrics`), encoded and served by
//! the crate's `prometheus` module, which the collector shares.
pub mod agent_metrics;

pub use sqlbee_prometheus::{
    CONTENT_TYPE, Encoder, Family, MetricType, MetricsError, MetricsServer, Render, SampleValue,
};
