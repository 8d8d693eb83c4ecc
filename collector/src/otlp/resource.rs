//! The OTLP resource of one database instance, which both signals share.
use super::wire::{InstrumentationScope, KeyValue, Resource};

/// What names one instance.
pub struct Instance<'a> {
    pub name: &'a str,
    /// `mariadb` or `mysql`, from the server's version string.
    pub system: &'static str,
    pub host: &'a str,
}

/// `db.system.name` for a server's version string.
pub fn system_of(server_version: &str) -> &'static str {
    if server_version.to_ascii_lowercase().contains("mariadb") { "mariadb" } else { "mysql" }
}

pub fn resource(instance: &Instance<'_>) -> Resource {
    let mut attributes = vec![
        KeyValue::string("service.name", "sqlbee"),
        KeyValue::string("sqlbee.instance", instance.name),
        KeyValue::string("db.system.name", instance.system),
    ];
    if !instance.host.is_empty() {
        attributes.push(KeyValue::string("host.name", instance.host));
    }
    Resource { attributes }
}

pub fn scope() -> InstrumentationScope {
    InstrumentationScope { name: "sqlbee".into(), version: env!("CARGO_PKG_VERSION").into() }
}
