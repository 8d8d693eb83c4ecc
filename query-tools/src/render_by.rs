//! `sqlbee top --by tag:KEY|client|program|process|address|container|pod`: the
//! top digests' statements grouped by the values of one query tag, or by
//! who sent them. Built from the answer's digests, so it covers what
//! `--limit` digests and their listed values hold; statements whose value a
//! digest did not list, or that had no such value, are grouped as such, and
//! every group's count is exact for those digests.
use std::{collections::BTreeMap, io::Write};

use serde_json::{Value, json};
use sqlbee_proto::v1::{ClientCount, TopDigest};

use super::cells::cut;

/// What `--by` groups statements by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum By {
    /// A query tag's values.
    Tag(String),
    /// Whole clients: program, process and pid, address, container.
    Client,
    /// The name the client gave itself at connect.
    Program,
    Process,
    Address,
    Container,
    Pod,
    /// Not a grouping of digests: `top --by table` ranks tables, the time
    /// of the statements that touch each and of the rows events replicas
    /// applied to it (`lib::top_tables`).
    Table,
}

impl By {
    pub fn parse(value: &str) -> Result<By, String> {
        Ok(match value {
            "client" => By::Client,
            "program" => By::Program,
            "process" => By::Process,
            "address" => By::Address,
            "container" => By::Container,
            "pod" => By::Pod,
            "table" => By::Table,
            _ => match value.strip_prefix("tag:") {
                Some(key) if !key.is_empty() => By::Tag(key.to_string()),
                _ => {
                    return Err(format!(
                        "{value:?}: expected tag:KEY, client, program, process, address, container, pod or table \
                         (as `--by tag:controller` or `--by pod`)"
                    ));
                }
            },
        })
    }

    fn name(&self) -> String {
        match self {
            By::Tag(key) => format!("tag:{key}"),
            By::Client => "client".into(),
            By::Program => "program".into(),
            By::Process => "process".into(),
            By::Address => "address".into(),
            By::Container => "container".into(),
            By::Pod => "pod".into(),
            By::Table => "table".into(),
        }
    }

    /// The label of a group of statements without a value.
    fn missing(&self) -> String {
        match self {
            By::Tag(key) => format!("(no {key} tag)"),
            By::Client => "(client not named)".into(),
            other => format!("(no {})", other.name()),
        }
    }

    /// The label of statements whose value a digest did not list.
    fn unlisted(&self) -> &'static str {
        match self {
            By::Tag(_) => "(other values)",
            _ => "(other clients)",
        }
    }

    /// One client's value; None: it has none.
    fn of_client(&self, c: &ClientCount) -> Option<String> {
        let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
        match self {
            By::Tag(_) | By::Table => None,
            By::Client => Some(client_label(c)).filter(|l| !l.is_empty()),
            By::Program => text(&c.program),
            By::Process => text(&c.process),
            By::Address => text(&c.address),
            By::Container => text(&c.container),
            By::Pod => {
                text(&c.pod).map(|pod| if c.namespace.is_empty() { pod } else { format!("{}/{pod}", c.namespace) })
            }
        }
    }

    /// A digest's statements as (value, count) shares, (None, n) for those
    /// a digest did not list, and the statements with no value.
    fn shares(&self, d: &TopDigest) -> (Vec<(Option<String>, u64)>, u64) {
        let mut shares = Vec::new();
        let mut missing = 0u64;
        let mut listed = 0u64;
        match self {
            By::Tag(key) => {
                if let Some(tag) = d.tags.iter().find(|t| &t.key == key) {
                    shares.extend(tag.values.iter().map(|v| (Some(v.value.clone()), v.count)));
                    if tag.other > 0 {
                        shares.push((None, tag.other));
                    }
                }
                listed = shares.iter().map(|(_, n)| n).sum();
            }
            _ => {
                for c in &d.clients {
                    listed = listed.saturating_add(c.count);
                    match self.of_client(c) {
                        Some(value) => shares.push((Some(value), c.count)),
                        None => missing = missing.saturating_add(c.count),
                    }
                }
                // Statements from clients the digest did not list or name.
                if d.count > listed {
                    shares.push((None, d.count - listed));
                }
                return (shares, missing);
            }
        }
        (shares, missing + d.count.saturating_sub(listed))
    }
}

/// A client as one line: `process[pid] as program from address in
/// container`, what is known.
pub fn client_label(c: &ClientCount) -> String {
    let mut parts = Vec::new();
    if !c.process.is_empty() {
        parts.push(if c.pid != 0 { format!("{}[{}]", c.process, c.pid) } else { c.process.clone() });
    }
    if !c.program.is_empty() {
        parts.push(format!("as {}", c.program));
    }
    if !c.address.is_empty() {
        parts.push(format!("from {}", c.address));
    }
    if !c.pod.is_empty() {
        parts.push(format!(
            "pod {}",
            if c.namespace.is_empty() { c.pod.clone() } else { format!("{}/{}", c.namespace, c.pod) }
        ));
    } else if !c.container.is_empty() {
        parts.push(format!("in {}", c.container));
    }
    parts.join(" ")
}

/// `top --client`, `--pod` and `--tag KEY=VALUE`: which of a digest's
/// statements a filter keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    /// A client by its program, process name, address, container or its
    /// whole label (as `--by client` prints it).
    Client(String),
    /// `POD` or `NAMESPACE/POD`.
    Pod(String),
    Tag(String, String),
}

impl Filter {
    pub fn parse_tag(value: &str) -> Result<Filter, String> {
        match value.split_once('=') {
            Some((key, v)) if !key.is_empty() => Ok(Filter::Tag(key.to_string(), v.to_string())),
            _ => Err(format!("{value:?}: expected KEY=VALUE, as `--tag controller=orders`")),
        }
    }

    /// The statements of `d` the filter keeps, as its breakdowns list them
    /// (0: none listed).
    pub fn matched(&self, d: &TopDigest) -> u64 {
        match self {
            Filter::Client(name) => d
                .clients
                .iter()
                .filter(|c| {
                    [&c.program, &c.process, &c.address, &c.container].contains(&name) || client_label(c) == *name
                })
                .map(|c| c.count)
                .sum(),
            Filter::Pod(name) => d
                .clients
                .iter()
                .filter(|c| !c.pod.is_empty() && (c.pod == *name || format!("{}/{}", c.namespace, c.pod) == *name))
                .map(|c| c.count)
                .sum(),
            Filter::Tag(key, value) => d
                .tags
                .iter()
                .filter(|t| t.key == *key)
                .flat_map(|t| &t.values)
                .filter(|v| v.value == *value)
                .map(|v| v.count)
                .sum(),
        }
    }
}

/// Under a filtered table: how many of each digest's statements the
/// filter matched.
pub fn write_matched(out: &mut impl Write, digests: &[TopDigest], matched: &[u64]) -> std::io::Result<()> {
    writeln!(out, "\n{:>12}  DIGEST (statements the filter matched)", "MATCHED")?;
    for (d, n) in digests.iter().zip(matched) {
        writeln!(out, "{n:>12}  {}", cut(&d.digest_text, 100))?;
    }
    out.flush()
}

/// One value's statements over the top digests, most first.
pub struct Group<'a> {
    /// None: a value not listed ("other values"); `Some("")` never.
    pub value: Option<String>,
    /// Statements that had no value at all.
    pub missing: bool,
    pub count: u64,
    /// (digest, statements), most first.
    pub digests: Vec<(&'a TopDigest, u64)>,
}

pub fn groups<'a>(digests: &'a [TopDigest], by: &By) -> Vec<Group<'a>> {
    let mut grouped: BTreeMap<(bool, Option<String>), Vec<(&TopDigest, u64)>> = BTreeMap::new();
    for d in digests {
        let (shares, missing) = by.shares(d);
        for (value, n) in shares {
            let entry = grouped.entry((false, value)).or_default();
            match entry.iter_mut().find(|(known, _)| known.digest == d.digest && known.schema == d.schema) {
                Some((_, total)) => *total += n,
                None => entry.push((d, n)),
            }
        }
        if missing > 0 {
            grouped.entry((true, None)).or_default().push((d, missing));
        }
    }
    let mut out: Vec<Group> = grouped
        .into_iter()
        .map(|((missing, value), mut digests)| {
            digests.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.digest.cmp(&b.0.digest)));
            let count = digests.iter().map(|(_, n)| n).sum();
            Group { value, missing, count, digests }
        })
        .collect();
    out.sort_by(|a, b| a.missing.cmp(&b.missing).then(b.count.cmp(&a.count)).then(a.value.cmp(&b.value)));
    out
}

fn label(by: &By, g: &Group) -> String {
    match (g.missing, &g.value) {
        (true, _) => by.missing(),
        (false, None) => by.unlisted().to_string(),
        (false, Some(v)) => v.clone(),
    }
}

pub fn write_table(out: &mut impl Write, digests: &[TopDigest], by: &By) -> std::io::Result<()> {
    let heading = match by {
        By::Tag(key) => key.to_uppercase(),
        other => other.name().to_uppercase(),
    };
    writeln!(out, "{heading:<40} {:>12} {:>8}  TOP DIGEST", "STATEMENTS", "DIGESTS")?;
    for g in groups(digests, by) {
        let top = g.digests.first().map(|(d, _)| d.digest_text.as_str()).unwrap_or_default();
        writeln!(out, "{:<40} {:>12} {:>8}  {}", cut(&label(by, &g), 40), g.count, g.digests.len(), cut(top, 80))?;
    }
    out.flush()
}

pub fn json(digests: &[TopDigest], by: &By) -> Value {
    let groups: Vec<Value> = groups(digests, by)
        .into_iter()
        .map(|g| {
            let mut group = json!({
                "value": g.value,
                "count": g.count,
                "digests": g.digests.iter().map(|(d, n)| json!({
                    "digest": format!("{:016x}", d.digest),
                    "digest_text": d.digest_text,
                    "schema": d.schema,
                    "count": n,
                })).collect::<Vec<_>>(),
            });
            let missing = if matches!(by, By::Tag(_)) { "untagged" } else { "missing" };
            group[missing] = json!(g.missing);
            group
        })
        .collect();
    json!({"by": by.name(), "groups": groups})
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlbee_proto::v1::{TagCount, TagValue};

    fn digest(id: u64, count: u64, values: &[(&str, u64)], other: u64) -> TopDigest {
        TopDigest {
            digest: id,
            digest_text: format!("SELECT {id}"),
            count,
            tags: vec![TagCount {
                key: "controller".into(),
                values: values.iter().map(|(v, n)| TagValue { value: v.to_string(), count: *n }).collect(),
                other,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn groups_add_up_to_the_digests() {
        let digests = [digest(1, 10, &[("orders", 6), ("carts", 1)], 2), digest(2, 5, &[("orders", 5)], 0)];
        let g = groups(&digests, &By::Tag("controller".into()));
        let summary: Vec<(Option<&str>, bool, u64, usize)> =
            g.iter().map(|g| (g.value.as_deref(), g.missing, g.count, g.digests.len())).collect();
        assert_eq!(
            summary,
            [(Some("orders"), false, 11, 2), (None, false, 2, 1), (Some("carts"), false, 1, 1), (None, true, 1, 1)]
        );
        assert_eq!(g.iter().map(|g| g.count).sum::<u64>(), 15);
        let route = groups(&digests, &By::Tag("route".into()));
        assert_eq!(route.iter().map(|g| (g.missing, g.count)).collect::<Vec<_>>(), [(true, 15)]);
    }

    #[test]
    fn filters_count_what_the_breakdowns_list() {
        let mut d = digest(1, 20, &[("orders", 6)], 2);
        d.clients = vec![
            ClientCount {
                process: "php-fpm".into(),
                pid: 3,
                pod: "web-1".into(),
                namespace: "shop".into(),
                count: 8,
                ..Default::default()
            },
            ClientCount { address: "10.0.0.9".into(), count: 4, ..Default::default() },
        ];
        assert_eq!(Filter::Client("php-fpm".into()).matched(&d), 8);
        assert_eq!(Filter::Client("10.0.0.9".into()).matched(&d), 4);
        assert_eq!(Filter::Client("php-fpm[3] pod shop/web-1".into()).matched(&d), 8);
        assert_eq!(Filter::Pod("web-1".into()).matched(&d), 8);
        assert_eq!(Filter::Pod("shop/web-1".into()).matched(&d), 8);
        assert_eq!(Filter::Pod("web-2".into()).matched(&d), 0);
        assert_eq!(Filter::parse_tag("controller=orders").unwrap().matched(&d), 6);
        assert!(Filter::parse_tag("orders").is_err());
    }

    #[test]
    fn clients_group_by_any_of_their_parts_and_add_up() {
        let client = |process: &str, pid: u32, address: &str, pod: &str, count: u64| ClientCount {
            process: process.into(),
            pid,
            address: address.into(),
            pod: pod.into(),
            count,
            ..Default::default()
        };
        let mut one = digest(1, 20, &[], 0);
        one.clients = vec![
            client("php-fpm", 10, "", "web-1", 8),
            client("php-fpm", 11, "", "web-2", 5),
            client("", 0, "10.0.0.9", "", 4),
        ];
        let mut two = digest(2, 6, &[], 0);
        two.clients = vec![client("php-fpm", 10, "", "web-1", 6)];
        let digests = [one, two];
        let summary =
            |by: By| -> Vec<(String, u64)> { groups(&digests, &by).iter().map(|g| (label(&by, g), g.count)).collect() };
        assert_eq!(
            summary(By::Process),
            [("php-fpm".into(), 19), ("(other clients)".into(), 3), ("(no process)".into(), 4)]
        );
        assert_eq!(
            summary(By::Pod),
            [("web-1".into(), 14), ("web-2".into(), 5), ("(other clients)".into(), 3), ("(no pod)".into(), 4)]
        );
        let clients = summary(By::Client);
        assert_eq!(clients[0], ("php-fpm[10] pod web-1".into(), 14));
        assert_eq!(clients.iter().map(|(_, n)| n).sum::<u64>(), 26);
        assert!(By::parse("tag:").is_err() && By::parse("user").is_err());
        assert_eq!(By::parse("program"), Ok(By::Program));
    }
}
