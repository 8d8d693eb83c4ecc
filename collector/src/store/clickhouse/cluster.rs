//! A store on a ClickHouse cluster (`?cluster=NAME`): replicated, sharded
//! by agent.
//!
//! Every agent's rows live on one shard, the one its id hashes to
//! (`shard_of`), in that shard's `ReplicatedMergeTree` tables: its batch
//! records, the rows they vouch for, its plans and the rollups of its
//! rows. So the exactly-once rule (see the module comment of `clickhouse`)
//! is a question each shard answers alone: a write looks up and writes
//! records on the agent's shard only, and a read through the
//! `Distributed` tables runs its winners' subquery on each shard's own
//! tables (`distributed_product_mode = 'local'`).
//!
//! A collector writes to a shard through any of its replicas it was given,
//! the one that answered last first, and fails over to the next when one
//! cannot be reached (`http::Client::post`). Reads go through any node.
//!
//! Which shard a node serves it learns from the node itself
//! (`system.clusters`, the shard its `is_local` marks); every shard needs
//! at least one node in the store's location.
use super::http::{Client, HttpError, quote};

/// What keeps a cluster store from opening.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no node given knows the cluster {cluster:?} (it must be in each node's remote_servers)")]
    Unknown { cluster: String },
    #[error(
        "shard {shard} of the cluster {cluster:?} has no reachable node among those given: list at least one of \
         its replicas' HTTP addresses in the store location"
    )]
    ShardWithoutNode { cluster: String, shard: u32 },
    #[error("the node {node} is not a node of the cluster {cluster:?} (no shard of it is local there)")]
    Stranger { node: String, cluster: String },
    #[error(transparent)]
    Http(#[from] HttpError),
}

/// The nodes given for a cluster store, by shard.
#[derive(Debug)]
pub(super) struct Placement {
    /// The HTTP bases of each shard's replicas, shard 1 first.
    pub shards: Vec<Vec<String>>,
    /// Nodes that could not be reached: placed later, when they answer
    /// (`place`).
    pub unplaced: Vec<String>,
}

/// Asks each node given which shard it serves.
pub(super) fn discover(all: &Client, cluster: &str) -> Result<Placement, ClusterError> {
    let mut shards: Vec<Vec<String>> = Vec::new();
    let mut unplaced = Vec::new();
    for base in all.bases() {
        let (count, own) = match shard_of_node(all, &base, cluster) {
            Ok(found) => found,
            Err(ClusterError::Http(e)) if e.is_unreachable() => {
                tracing::warn!(node = %base, error = %e, "a ClickHouse node given for the cluster store is unreachable; writes use the others until it answers");
                unplaced.push(base);
                continue;
            }
            Err(e) => return Err(e),
        };
        shards.resize(shards.len().max(count as usize), Vec::new());
        shards[own as usize - 1].push(base);
    }
    if shards.is_empty() {
        // Nothing answered: the first node's error says why.
        all.with_bases(vec![all.bases()[0].clone()]).select("SELECT 1")?;
    }
    if let Some(empty) = shards.iter().position(Vec::is_empty) {
        return Err(ClusterError::ShardWithoutNode { cluster: cluster.to_string(), shard: empty as u32 + 1 });
    }
    Ok(Placement { shards, unplaced })
}

/// The node at `base`: how many shards the cluster has, and which (from 1)
/// is its own.
pub(super) fn shard_of_node(all: &Client, base: &str, cluster: &str) -> Result<(u32, u32), ClusterError> {
    let mut rows = all.with_bases(vec![base.to_string()]).select(&format!(
        "SELECT toUInt32(max(shard_num)), toUInt32(maxIf(shard_num, is_local)) FROM system.clusters
         WHERE cluster = {}",
        quote(cluster)
    ))?;
    let malformed =
        |e: super::http::Malformed| HttpError::Server { url: base.to_string(), status: 200, message: e.to_string() };
    let (count, own) = (rows.u32().map_err(malformed)?, rows.u32().map_err(malformed)?);
    if count == 0 {
        return Err(ClusterError::Unknown { cluster: cluster.to_string() });
    }
    if own == 0 {
        return Err(ClusterError::Stranger { node: base.to_string(), cluster: cluster.to_string() });
    }
    Ok((count, own))
}

/// The shard (from 0) of an agent among `shards`: FNV-1a of its id, so
/// every collector, of any version, puts an agent on the same shard while
/// the cluster keeps its shards.
pub fn shard_of(agent_id: &str, shards: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in agent_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % shards.max(1) as u64) as usize
}

/// Whether the replica `shard` talks to now holds every insert its shard
/// took more than `settle_ms` ago: connected to ZooKeeper, writable, and
/// lagging its shard by no more than that. A rollup pass reads a shard
/// only from such a replica; it rolls up only batches stored that long
/// before it, and a replica back from an outage may still lack some of
/// them, which a pass that marked their bucket would never count.
pub(super) fn caught_up(shard: &Client, settle_ms: i64) -> Result<bool, HttpError> {
    let mut rows = shard.select(&format!(
        "SELECT toUInt64(count()) FROM system.replicas WHERE database = currentDatabase()
         AND (is_readonly OR is_session_expired OR absolute_delay * 1000 > {})",
        settle_ms.max(0)
    ))?;
    let behind =
        rows.u64().map_err(|e| HttpError::Server { url: String::new(), status: 200, message: e.to_string() })?;
    Ok(behind == 0)
}

#[cfg(test)]
mod tests {
    use super::shard_of;

    #[test]
    fn an_agent_keeps_its_shard_and_agents_spread() {
        // Pinned: a change would move agents between shards.
        assert_eq!(shard_of("a", 2), (0xaf63_dc4c_8601_ec8c_u64 % 2) as usize);
        assert_eq!(shard_of("", 1), 0);
        let on_first = (0..1000).filter(|n| shard_of(&format!("agent-{n}"), 2) == 0).count();
        assert!((400..600).contains(&on_first), "{on_first} of 1000 on shard 1");
    }
}
