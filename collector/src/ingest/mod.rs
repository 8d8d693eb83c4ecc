//! The Ingest service: check that the caller speaks for the batch's agent
//! and instances (`auth`, `ownership`) and that the agent has a place in
//! flight (a token's places are taken before decoding, by `admission`), correct
//! a clock that runs ahead (`clock_skew`), validate, drop what retention
//! would remove anyway, store on the blocking pool (`store_task`). A batch
//! `validate` refuses is INVALID_ARGUMENT, which the agent never retries;
//! one it may not send is PERMISSION_DENIED, which it retries (an instance
//! handed over, a tokens file fixed and reloaded).
mod changes;
mod clock_skew;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use sqlbee_proto::v1::{ActivityAck, ActivityReport, Batch, PushResponse, ingest_server::Ingest};
use tonic::{Request, Response, Status};

use sqlbee_vocabulary::clock::now_unix_ms;

use crate::{
    auth::{Auth, Caller},
    live::LiveActivity,
    ownership::{Owners, Refused},
    places::Places,
    quota::{Cost, Quotas},
    store::{Store, content_hash},
    store_task::blocking_to_the_end,
    validate,
};

/// Pushes of one agent in flight at once: an agent sends one at a time,
/// and a retry may overlap the store of the attempt it replaces.
pub const PUSHES_PER_AGENT: usize = 2;

pub struct IngestService {
    store: Arc<dyn Store>,
    retention: Duration,
    auth: Auth,
    owners: Arc<Owners>,
    quotas: Arc<Quotas>,
    per_agent: Places<String>,
    live: Arc<LiveActivity>,
    /// `--require-instance-pins`: no instance is claimed by its first
    /// report, only pinned to a token.
    require_pins: bool,
    server_starts: Arc<changes::ServerStarts>,
}

impl IngestService {
    pub fn new(
        store: Arc<dyn Store>,
        retention: Duration,
        auth: Auth,
        owners: Arc<Owners>,
        quotas: Arc<Quotas>,
    ) -> IngestService {
        IngestService {
            store,
            retention,
            auth,
            owners,
            quotas,
            per_agent: Places::new(PUSHES_PER_AGENT),
            live: Arc::default(),
            require_pins: false,
            server_starts: Arc::default(),
        }
    }

    /// Takes windows only of instances a token pins.
    pub fn requiring_pins(mut self, require: bool) -> IngestService {
        self.require_pins = require;
        self
    }

    /// Keeps activity in these snapshots (which the Query service reads).
    pub fn with_live(mut self, live: Arc<LiveActivity>) -> IngestService {
        self.live = live;
        self
    }

    /// Refuses a batch with a window (or an untraced report) of an
    /// instance its caller does not speak for.
    fn speaks_for(&self, batch: &Batch, caller: Option<&Caller>, now_unix_ms: i64) -> Result<(), Refused> {
        let windows = batch.windows.iter().filter_map(|w| w.instance.as_ref());
        let untraced = batch.agent_windows.iter().flat_map(|w| &w.untraced).filter_map(|u| u.instance.as_ref());
        let names: BTreeSet<&str> = windows.chain(untraced).map(|i| i.name.as_str()).collect();
        let agent = batch.agent.as_ref().map(|a| a.agent_id.as_str()).unwrap_or("");
        self.may_speak_for(agent, names, caller, now_unix_ms)
    }

    /// Whether `agent` (and the caller's token) may speak for every one of
    /// these instances; one nobody speaks for yet becomes the agent's.
    fn may_speak_for(
        &self,
        agent: &str,
        names: BTreeSet<&str>,
        caller: Option<&Caller>,
        now_unix_ms: i64,
    ) -> Result<(), Refused> {
        let unpinned = self.unpinned(names, caller)?;
        if self.require_pins
            && let Some(name) = unpinned.first()
        {
            return Err(Refused::Unpinned { instance: name.to_string() });
        }
        self.owners.claim(agent, unpinned.into_iter(), now_unix_ms)
    }

    /// Whether `agent` may send live activity (or plans) of these
    /// instances: each pinned to the caller's token, or the agent's already
    /// through its windows. Claims nothing.
    fn may_send_live(
        &self,
        agent: &str,
        names: BTreeSet<&str>,
        caller: Option<&Caller>,
        now_unix_ms: i64,
    ) -> Result<(), Refused> {
        let unpinned = self.unpinned(names, caller)?;
        self.owners.check(agent, unpinned.into_iter(), now_unix_ms)
    }

    /// The names no token pins, once the pins allow the caller the rest.
    fn unpinned<'a>(&self, names: BTreeSet<&'a str>, caller: Option<&Caller>) -> Result<Vec<&'a str>, Refused> {
        let mut unpinned = Vec::with_capacity(names.len());
        for name in names {
            match caller {
                Some(c) if c.pins(name) => continue,
                Some(Caller { instances: Some(allowed), .. }) => {
                    return Err(Refused::NotPinnedHere { instance: name.to_string(), allowed: allowed.to_vec() });
                }
                _ if self.auth.pinned_elsewhere(name, caller) => {
                    return Err(Refused::PinnedElsewhere { instance: name.to_string() });
                }
                _ => unpinned.push(name),
            }
        }
        Ok(unpinned)
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn push_activity(&self, request: Request<ActivityReport>) -> Result<Response<ActivityAck>, Status> {
        let peer = request.remote_addr();
        let caller = request.extensions().get::<Caller>().cloned();
        let report = request.into_inner();
        let agent_id = report.agent.as_ref().map(|a| a.agent_id.clone()).unwrap_or_default();
        if agent_id.is_empty() {
            return Err(Status::invalid_argument("invalid activity: agent.agent_id is empty"));
        }
        if let Some(caller) = &caller {
            caller.check_agent(&agent_id)?;
        }
        let now = now_unix_ms();
        let names: BTreeSet<&str> =
            report.instances.iter().filter_map(|i| i.instance.as_ref()).map(|i| i.name.as_str()).collect();
        if names.contains("") {
            return Err(Status::invalid_argument("invalid activity: an instance has no name"));
        }
        if let Err(refused) = self.may_send_live(&agent_id, names, caller.as_ref(), now) {
            tracing::debug!(?peer, agent = agent_id, %refused, "refused activity for an instance its agent does not speak for");
            return Err(refused_status(refused));
        }
        self.live.put(report, now).map_err(|full| {
            tracing::warn!(?peer, agent = agent_id, %full, "refused activity");
            Status::resource_exhausted(full.to_string())
        })?;
        Ok(Response::new(ActivityAck { collector_unix_ms: now }))
    }

    async fn push(&self, request: Request<Batch>) -> Result<Response<PushResponse>, Status> {
        let peer = request.remote_addr();
        let caller = request.extensions().get::<Caller>().cloned();
        let mut batch = request.into_inner();
        let agent_id = batch.agent.as_ref().map(|a| a.agent_id.clone()).unwrap_or_default();
        if let Some(caller) = &caller {
            caller.check_agent(&agent_id).inspect_err(|_| {
                tracing::warn!(?peer, agent = agent_id, "refused a batch of an agent its token is not bound to")
            })?;
        }
        // Held until the batch's store work ends.
        let agent_place = self.per_agent.take(agent_id.clone()).ok_or_else(|| {
            Status::resource_exhausted(format!(
                "{} pushes of agent {agent_id:?} in flight already; retry later",
                self.per_agent.limit()
            ))
        })?;
        let now = now_unix_ms();
        // Before anything is moved or left out, so a replay hashes alike.
        let content_hash = content_hash(&batch);
        let clock_correction_ms = clock_skew::correct(&mut batch, now);
        if clock_correction_ms != 0 {
            tracing::warn!(
                ?peer,
                agent = agent_id,
                sequence = batch.sequence,
                clock_correction_ms,
                "the agent's clock runs ahead of the collector's; its windows were moved back"
            );
        }
        if let Err(invalid) = validate::batch(&batch, now) {
            tracing::warn!(?peer, agent = agent_id, sequence = batch.sequence, %invalid, "refused an invalid batch");
            return Err(Status::invalid_argument(format!("invalid batch: {invalid}")));
        }
        if let Err(refused) = self.speaks_for(&batch, caller.as_ref(), now) {
            tracing::warn!(?peer, agent = agent_id, %refused, "refused a batch for an instance its agent does not speak for");
            return Err(refused_status(refused));
        }
        cut_blocker_statements(&mut batch);
        let cost = Cost::of(&batch);
        if let Err(over) = self.quotas.charge(&agent_id, cost, now) {
            tracing::warn!(?peer, agent = agent_id, sequence = batch.sequence, %over, "refused a batch over its agent's quota");
            return Err(Status::resource_exhausted(over.to_string()));
        }
        // Windows that retention would delete at the next prune are not
        // stored at all; the batch itself is still recorded, so a replay
        // stays a duplicate.
        let cutoff = now.saturating_sub(self.retention.as_millis() as i64);
        let before = batch.windows.len();
        batch.windows.retain(|w| w.window_end_unix_ms >= cutoff);
        if batch.windows.len() < before {
            tracing::info!(expired = before - batch.windows.len(), "skipped windows older than the retention");
        }
        let sequence = batch.sequence;
        let store = self.store.clone();
        let server_starts = self.server_starts.clone();
        let outcome = blocking_to_the_end(move || {
            let _place = agent_place;
            // The changes first: a batch whose windows fail to store is
            // sent again and writes the same events again (their ids come
            // from what they record), while one stored is never replayed.
            let mut events = changes::statement_events(&batch);
            events.extend(server_starts.events(&store, &batch, cutoff)?);
            if !events.is_empty() {
                store.put_events(&events)?;
                server_starts.recorded(&events);
            }
            store.ingest(batch, now, content_hash)
        })
        .await
        .inspect(|outcome| {
            if outcome.duplicate {
                self.quotas.refund(&agent_id, cost);
            }
        })
        .inspect_err(|s| {
            self.quotas.refund(&agent_id, cost);
            if s.code() == tonic::Code::AlreadyExists {
                tracing::error!(?peer, agent = agent_id, sequence, "{}", s.message());
            }
        })?;
        tracing::debug!(sequence, duplicate = outcome.duplicate, "batch stored");
        Ok(Response::new(PushResponse {
            sequence,
            duplicate: outcome.duplicate,
            collector_unix_ms: now_unix_ms(),
            clock_correction_ms,
        }))
    }
}

/// A refusal as the agent should take it: too many instances is a limit
/// it may fall under again (retried with backoff), activity before the
/// instance's first window comes in order soon, the rest are not its to
/// send.
fn refused_status(refused: Refused) -> Status {
    match refused {
        Refused::TooMany { .. } => Status::resource_exhausted(refused.to_string()),
        // Activity ahead of the instance's first window: it comes.
        Refused::NotClaimed { .. } => Status::failed_precondition(refused.to_string()),
        _ => Status::permission_denied(refused.to_string()),
    }
}

/// Bytes of a blocker's statement kept: what the pages and the query tools
/// show of it, with room to spare. A lock wait may name 32 blockers of 8
/// statements each; whole, they could be 16 MiB a wait, stored and read
/// back to print a line each.
pub const BLOCKER_STATEMENT_KEPT: usize = 1024;

fn cut_blocker_statements(batch: &mut sqlbee_proto::v1::Batch) {
    let statements = batch
        .windows
        .iter_mut()
        .flat_map(|w| w.lock_waits.iter_mut())
        .flat_map(|l| l.blockers.iter_mut())
        .flat_map(|b| b.statements.iter_mut());
    for statement in statements.filter(|s| s.len() > BLOCKER_STATEMENT_KEPT) {
        let mut cut = BLOCKER_STATEMENT_KEPT - '…'.len_utf8();
        while !statement.is_char_boundary(cut) {
            cut -= 1;
        }
        statement.truncate(cut);
        statement.push('…');
    }
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{Batch, Blocker, InstanceWindow, LockWait};

    use super::*;

    #[test]
    fn long_blocker_statements_are_cut_on_a_character() {
        let long = "é".repeat(3000);
        let mut batch = Batch {
            windows: vec![InstanceWindow {
                lock_waits: vec![LockWait {
                    blockers: vec![Blocker { statements: vec![long, "SELECT 1".into()], ..Default::default() }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        cut_blocker_statements(&mut batch);
        let kept = &batch.windows[0].lock_waits[0].blockers[0].statements;
        assert!(kept[0].len() <= BLOCKER_STATEMENT_KEPT && kept[0].ends_with('…'), "{}", kept[0].len());
        assert!(kept[0].starts_with("éé"));
        assert_eq!(kept[1], "SELECT 1");
    }
}
