//! `sqlbee top --by tag:KEY`: the top digests' statements grouped by the
//! values of one query tag. Built from the answer's digests, so it covers
//! what `--limit` digests and their listed values hold; statements whose
//! value a digest did not list, or that had no such tag, are grouped as
//! such, and every group's count is exact for those digests.
use std::{collections::BTreeMap, io::Write};

use serde_json::{Value, json};
use sqlbee_proto::v1::TopDigest;

use super::cells::cut;

/// One value's statements over the top digests, most first.
pub struct Group<'a> {
    /// None: a value not listed ("other values"); `Some("")` never.
    pub value: Option<&'a str>,
    pub untagged: bool,
    pub count: u64,
    /// (digest, statements), most first.
    pub digests: Vec<(&'a TopDigest, u64)>,
}

pub fn groups<'a>(digests: &'a [TopDigest], key: &str) -> Vec<Group<'a>> {
    let mut by: BTreeMap<(bool, Option<&str>), Vec<(&TopDigest, u64)>> = BTreeMap::new();
    for d in digests {
        let tag = d.tags.iter().find(|t| t.key == key);
        let mut tagged = 0u64;
        for v in tag.map(|t| t.values.as_slice()).unwrap_or_default() {
            by.entry((false, Some(&v.value))).or_default().push((d, v.count));
            tagged = tagged.saturating_add(v.count);
        }
        if let Some(t) = tag.filter(|t| t.other > 0) {
            by.entry((false, None)).or_default().push((d, t.other));
            tagged = tagged.saturating_add(t.other);
        }
        if d.count > tagged {
            by.entry((true, None)).or_default().push((d, d.count - tagged));
        }
    }
    let mut out: Vec<Group> = by
        .into_iter()
        .map(|((untagged, value), mut digests)| {
            digests.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.digest.cmp(&b.0.digest)));
            let count = digests.iter().map(|(_, n)| n).sum();
            Group { value, untagged, count, digests }
        })
        .collect();
    out.sort_by(|a, b| a.untagged.cmp(&b.untagged).then(b.count.cmp(&a.count)).then(a.value.cmp(&b.value)));
    out
}

pub fn write_table(out: &mut impl Write, digests: &[TopDigest], key: &str) -> std::io::Result<()> {
    writeln!(out, "{:<32} {:>12} {:>8}  TOP DIGEST", key.to_uppercase(), "STATEMENTS", "DIGESTS")?;
    for g in groups(digests, key) {
        let label = match (g.untagged, g.value) {
            (true, _) => format!("(no {key} tag)"),
            (false, None) => "(other values)".to_string(),
            (false, Some(v)) => v.to_string(),
        };
        let top = g.digests.first().map(|(d, _)| d.digest_text.as_str()).unwrap_or_default();
        writeln!(out, "{:<32} {:>12} {:>8}  {}", cut(&label, 32), g.count, g.digests.len(), cut(top, 80))?;
    }
    out.flush()
}

pub fn json(digests: &[TopDigest], key: &str) -> Value {
    let groups: Vec<Value> = groups(digests, key)
        .into_iter()
        .map(|g| {
            json!({
                "value": g.value,
                "untagged": g.untagged,
                "count": g.count,
                "digests": g.digests.iter().map(|(d, n)| json!({
                    "digest": format!("{:016x}", d.digest),
                    "digest_text": d.digest_text,
                    "schema": d.schema,
                    "count": n,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"by": format!("tag:{key}"), "groups": groups})
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
        let g = groups(&digests, "controller");
        let summary: Vec<(Option<&str>, bool, u64, usize)> =
            g.iter().map(|g| (g.value, g.untagged, g.count, g.digests.len())).collect();
        assert_eq!(
            summary,
            [(Some("orders"), false, 11, 2), (None, false, 2, 1), (Some("carts"), false, 1, 1), (None, true, 1, 1)]
        );
        assert_eq!(g.iter().map(|g| g.count).sum::<u64>(), 15);
        assert_eq!(groups(&digests, "route").iter().map(|g| (g.untagged, g.count)).collect::<Vec<_>>(), [(true, 15)]);
    }
}
