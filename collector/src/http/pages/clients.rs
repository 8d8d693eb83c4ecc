//! Clients: who sent the statements of the range, from the top digests'
//! client breakdowns. One row per client program (its process, container,
//! pod or address, pids folded together), with its statements, an
//! estimate of its time (each digest's mean latency times the client's
//! statements of it) and its digests, linked to their pages. Statements no
//! client was named for are a row of their own, so the rows add up to the
//! digests' counts.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write,
};

use sqlbee_proto::v1::{ClientCount, TopDigest, TopRequest};

use super::{PageHead, Rendered, digest_href, instance_names, top_request};
use crate::http::{
    Ui,
    html::{self, Nav, esc},
    params::View,
};

/// Digests whose clients the page adds up: the costliest.
const MAX_DIGESTS: u32 = 1_000;
/// Digests listed under each client.
const DIGESTS_PER_CLIENT: usize = 5;

/// A client as the page groups it: (program, process, container, pod,
/// address); all empty for statements no client was named for.
type ClientKey = (String, String, String, String, String);

fn key_of(c: &ClientCount) -> ClientKey {
    let pod = if c.namespace.is_empty() { c.pod.clone() } else { format!("{}/{}", c.namespace, c.pod) };
    // A local process is told by what it is, not by the port it came from.
    let address = if c.process.is_empty() { c.address.clone() } else { String::new() };
    (c.program.clone(), c.process.clone(), c.container.clone(), pod, address)
}

#[derive(Default)]
struct ClientTotals {
    statements: u64,
    est_ns: f64,
    pids: BTreeSet<u32>,
    addresses: BTreeSet<String>,
    /// (statements, digest), most first once sorted.
    digests: Vec<(u64, TopDigest)>,
}

fn totals(digests: Vec<TopDigest>) -> Vec<(ClientKey, ClientTotals)> {
    let mut by: BTreeMap<ClientKey, ClientTotals> = BTreeMap::new();
    for d in digests {
        let mean = if d.count > 0 { d.sum_ns as f64 / d.count as f64 } else { 0.0 };
        let mut shares: Vec<(ClientKey, u64, u32, String)> =
            d.clients.iter().map(|c| (key_of(c), c.count, c.pid, c.address.clone())).collect();
        let named: u64 = d.clients.iter().map(|c| c.count).sum();
        if d.count > named {
            shares.push((ClientKey::default(), d.count - named, 0, String::new()));
        }
        for (key, n, pid, address) in shares {
            let t = by.entry(key).or_default();
            t.statements += n;
            t.est_ns += n as f64 * mean;
            if pid != 0 {
                t.pids.insert(pid);
            }
            if !address.is_empty() {
                t.addresses.insert(address);
            }
            match t.digests.iter_mut().find(|(_, known)| known.digest == d.digest && known.schema == d.schema) {
                Some((total, _)) => *total += n,
                None => t.digests.push((n, TopDigest { clients: Vec::new(), ..d.clone() })),
            }
        }
    }
    let mut out: Vec<_> = by.into_iter().collect();
    // The unnamed last, the rest by estimated time.
    out.sort_by(|a, b| {
        (a.0 == ClientKey::default()).cmp(&(b.0 == ClientKey::default())).then(b.1.est_ns.total_cmp(&a.1.est_ns))
    });
    out
}

pub async fn render(ui: &Ui, view: &View) -> Rendered {
    let answer = ui.top(TopRequest { limit: MAX_DIGESTS, order_by: "total".into(), ..top_request(view) }).await?;
    let instances = instance_names(ui).await?;
    let head = PageHead { title: "Clients".into(), nav: Nav::Clients, instances, keep: Vec::new() };
    let mut body = String::from(
        "<p>Who sent the statements of the costliest digests: each client as the agent on the server's node named \
         its connections (a local process, its container and pod; a remote client by its address) and the program \
         it said it is at connect, where the agent reads that. Time is an \
         estimate: each digest's mean latency times the client's statements of it.</p>",
    );
    if answer.digests.is_empty() {
        body.push_str(&html::notice("No statement ran in this range."));
        return Ok((head, body));
    }
    body.push_str(
        "<table class=\"data\" id=\"clients\"><thead><tr><th>Program</th><th>Process</th><th>Container</th><th>Pod</th>\
         <th>Address</th><th>Pids</th><th>Statements</th><th>Est. time</th><th>Digests</th></tr></thead><tbody>",
    );
    for ((program, process, container, pod, address), mut t) in totals(answer.digests) {
        let unnamed = [&program, &process, &container, &pod, &address].iter().all(|s| s.is_empty());
        let first = if unnamed { "<em>not named</em>".to_string() } else { esc(or_dash(&program)) };
        let addresses =
            if address.is_empty() { t.addresses.iter().cloned().collect::<Vec<_>>().join(", ") } else { address };
        let _ = write!(
            body,
            "<tr class=\"client\" data-program=\"{}\" data-process=\"{}\" data-container=\"{}\" data-pod=\"{}\" \
             data-statements=\"{}\"><td><strong>{first}</strong></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&program),
            esc(&process),
            esc(&container),
            esc(&pod),
            t.statements,
            esc(or_dash(&process)),
            esc(or_dash(&container)),
            esc(or_dash(&pod)),
            esc(or_dash(&addresses)),
            html::count(t.pids.len() as u64),
            html::count(t.statements),
            html::duration_ns(t.est_ns),
            html::count(t.digests.len() as u64)
        );
        t.digests.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.digest.cmp(&b.1.digest)));
        body.push_str("<tr class=\"client-digests\"><td colspan=\"9\"><ul>");
        for (n, d) in t.digests.iter().take(DIGESTS_PER_CLIENT) {
            let _ = write!(
                body,
                "<li><a class=\"client-digest\" data-digest=\"{}\" href=\"{}\">{}</a> · {} statements</li>",
                html::digest_hex(d.digest),
                esc(&digest_href(view, d.digest, &d.schema)),
                esc(&html::cut(&d.digest_text, 90)),
                html::count(*n)
            );
        }
        body.push_str("</ul></td></tr>");
    }
    body.push_str("</tbody></table>");
    Ok((head, body))
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}
