//! The Query service: checks the request, asks the store on the blocking
//! pool. Owns the request defaults and limits (limit 20 digests or 100 lock
//! waits, at most 10 000).
pub mod blame;
pub(crate) mod diff;
mod findings;
mod index_advice;
mod replication;
mod tables;

use std::sync::Arc;

use sqlbee_proto::v1::{
    ActivityRequest, ActivityResponse, AnnotationsRequest, AnnotationsResponse, DiffRequest, DiffResponse,
    EventsRequest, EventsResponse, HostsRequest, HostsResponse, InstancesRequest, InstancesResponse, LocksRequest,
    LocksResponse, LongStatementsRequest, LongStatementsResponse, PlansRequest, PlansResponse, ReplicationRequest,
    ReplicationResponse, SeriesRequest, SeriesResponse, TablesRequest, TablesResponse, TopRequest, TopResponse,
    TotalsRequest, TotalsResponse, query_server::Query,
};
use sqlbee_vocabulary::clock::now_unix_ms;
use tonic::{Request, Response, Status};

use crate::{
    live::LiveActivity,
    quota::Quotas,
    store::{
        AnnotationsQuery, EventsQuery, HostsQuery, LocksQuery, PlansQuery, SeriesOf, SeriesQuery, Store, TopPage,
        TopQuery, TotalsQuery, rollup,
    },
    store_task::blocking,
};

/// The rankings `Top` offers, for pages that list them.
pub use crate::store::OrderBy;
/// How a caller in process (the web UI) holds its admission place for the
/// whole of the store work a query starts.
pub use crate::store_task::holding;
/// The answers as JSON (the wire crate's, which the query tools print too).
pub use sqlbee_proto::json;

pub const DEFAULT_LIMIT: usize = 20;
pub const DEFAULT_LOCKS_LIMIT: usize = 100;
pub const DEFAULT_HOSTS_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;
/// A series answers at most this many points: a plot needs no more, and
/// a tiny step over a long range must not make the collector build
/// millions of them.
pub const MAX_POINTS: i64 = 2_000;
/// The points a series gets when the request names no step.
pub const DEFAULT_POINTS: i64 = 60;
/// Digests one series read may split by: a page's table, not a fleet's
/// catalogue.
pub const MAX_SPLIT_DIGESTS: usize = 1_000;

pub struct QueryService {
    store: Arc<dyn Store>,
    quotas: Arc<Quotas>,
    live: Arc<LiveActivity>,
}

impl QueryService {
    pub fn new(store: Arc<dyn Store>, quotas: Arc<Quotas>) -> QueryService {
        QueryService { store, quotas, live: Arc::default() }
    }

    /// Answers activity from these snapshots (the Ingest service's).
    pub fn with_live(mut self, live: Arc<LiveActivity>) -> QueryService {
        self.live = live;
        self
    }

    /// The service over `store` with no quota to report (tests).
    #[cfg(any(test, feature = "test-support"))]
    pub fn without_quotas(store: Arc<dyn Store>) -> QueryService {
        QueryService::new(store, Arc::new(Quotas::new(0, 0)))
    }
}

/// An empty filter field means "every".
fn non_empty(name: String) -> Option<String> {
    if name.is_empty() { None } else { Some(name) }
}

fn since(ms: i64) -> Result<i64, Status> {
    if ms < 0 {
        return Err(Status::invalid_argument(format!("since_unix_ms: {ms} is negative; 0 means all")));
    }
    Ok(ms)
}

/// The end of a range: 0 means no end.
fn until(ms: i64, since: i64) -> Result<i64, Status> {
    match ms {
        0 => Ok(i64::MAX),
        ms if ms <= since => {
            Err(Status::invalid_argument(format!("until_unix_ms: {ms} is not after since_unix_ms {since}")))
        }
        ms => Ok(ms),
    }
}

/// The step a series is cut into: the one asked for, or about
/// `DEFAULT_POINTS` over the range rounded up to a whole 10 s, minute, hour
/// or day, so the rollups can answer.
fn step(requested: i64, since: i64, until: i64) -> Result<i64, Status> {
    let span = until.saturating_sub(since);
    let step = match requested {
        n if n < 0 => return Err(Status::invalid_argument(format!("step_ms: {n} is negative; 0 picks one"))),
        0 => {
            let raw = (span / DEFAULT_POINTS).max(1);
            let unit = if raw > rollup::DAY_MS {
                rollup::DAY_MS
            } else if raw > rollup::HOUR_MS {
                rollup::HOUR_MS
            } else if raw > rollup::MINUTE_MS {
                rollup::MINUTE_MS
            } else {
                10_000
            };
            ((raw + unit - 1) / unit).saturating_mul(unit)
        }
        n => n,
    };
    if span / step > MAX_POINTS {
        return Err(Status::invalid_argument(format!(
            "step_ms: {step} ms over {span} ms is more than {MAX_POINTS} points; use a longer step or a shorter range"
        )));
    }
    Ok(step)
}

pub fn series_query(request: SeriesRequest, now_unix_ms: i64) -> Result<SeriesQuery, Status> {
    let of = match request.of.as_str() {
        "digest" if request.digest == 0 => {
            return Err(Status::invalid_argument("digest: of = digest needs a digest id"));
        }
        "digest" => SeriesOf::Digest(request.digest),
        "" | "statements" => SeriesOf::Statements,
        "cost" => SeriesOf::Cost,
        other => {
            return Err(Status::invalid_argument(format!(
                "of: unknown series {other:?}; expected digest, statements or cost"
            )));
        }
    };
    let since_unix_ms = since(request.since_unix_ms)?;
    if since_unix_ms == 0 {
        return Err(Status::invalid_argument("since_unix_ms: a series needs a start"));
    }
    let until_unix_ms = match request.until_unix_ms {
        0 => now_unix_ms.max(since_unix_ms + 1),
        ms => until(ms, since_unix_ms)?,
    };
    let step_ms = step(request.step_ms, since_unix_ms, until_unix_ms)?;
    Ok(SeriesQuery {
        of,
        instance: non_empty(request.instance),
        schema: non_empty(request.schema),
        // Steps start on multiples of the step, so a refreshed plot keeps
        // its points and the rollups line up with them.
        since_unix_ms: since_unix_ms.div_euclid(step_ms) * step_ms,
        until_unix_ms,
        step_ms,
    })
}

fn limit(requested: u32, default: usize) -> Result<usize, Status> {
    match requested as usize {
        0 => Ok(default),
        n if n > MAX_LIMIT => Err(Status::invalid_argument(format!("limit: {n} is above the maximum {MAX_LIMIT}"))),
        n => Ok(n),
    }
}

pub fn locks_query(request: LocksRequest) -> Result<LocksQuery, Status> {
    Ok(LocksQuery {
        limit: limit(request.limit, DEFAULT_LOCKS_LIMIT)?,
        since_unix_ms: since(request.since_unix_ms)?,
        instance: non_empty(request.instance),
    })
}

pub fn plans_query(request: PlansRequest) -> Result<PlansQuery, Status> {
    let since_unix_ms = since(request.since_unix_ms)?;
    Ok(PlansQuery {
        digest: (request.digest != 0).then_some(request.digest),
        schema: non_empty(request.schema),
        instance: non_empty(request.instance),
        until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
        since_unix_ms,
        limit: limit(request.limit, DEFAULT_LOCKS_LIMIT)?,
    })
}

pub fn events_query(request: EventsRequest) -> Result<EventsQuery, Status> {
    let since_unix_ms = since(request.since_unix_ms)?;
    let kind = non_empty(request.kind);
    if let Some(kind) = &kind
        && !EVENT_KINDS.contains(&kind.as_str())
    {
        return Err(Status::invalid_argument(format!(
            "kind: unknown event kind {kind:?}; expected one of {}",
            EVENT_KINDS.join(", ")
        )));
    }
    Ok(EventsQuery {
        instance: non_empty(request.instance),
        kind,
        until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
        since_unix_ms,
        open_only: request.open_only,
        limit: limit(request.limit, DEFAULT_LOCKS_LIMIT)?,
    })
}

/// The kinds of event the detection records.
pub use sqlbee_proto::query_client::EVENT_KINDS;

pub fn annotations_query(request: AnnotationsRequest) -> Result<AnnotationsQuery, Status> {
    let since_unix_ms = since(request.since_unix_ms)?;
    Ok(AnnotationsQuery {
        instance: non_empty(request.instance),
        until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
        since_unix_ms,
        id: (request.id != 0).then_some(request.id),
        limit: limit(request.limit, DEFAULT_LOCKS_LIMIT)?,
    })
}

pub fn top_query(request: TopRequest) -> Result<TopQuery, Status> {
    let order_by = OrderBy::parse(&request.order_by).ok_or_else(|| {
        Status::invalid_argument(format!(
            "order_by: unknown key {:?}; expected one of {}",
            request.order_by,
            OrderBy::NAMES.join(", ")
        ))
    })?;
    let limit = limit(request.limit, DEFAULT_LIMIT)?;
    let since_unix_ms = since(request.since_unix_ms)?;
    Ok(TopQuery {
        until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
        instance: non_empty(request.instance),
        digest: (request.digest != 0).then_some(request.digest),
        schema: non_empty(request.schema),
        nested: request.nested,
        program: non_empty(request.program),
        since_unix_ms,
        order_by,
        limit,
    })
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn top(&self, request: Request<TopRequest>) -> Result<Response<TopResponse>, Status> {
        let query = top_query(request.into_inner())?;
        let store = self.store.clone();
        let costs_query = TotalsQuery {
            instance: query.instance.clone(),
            since_unix_ms: query.since_unix_ms,
            until_unix_ms: query.until_unix_ms,
        };
        let TopPage { rows: mut digests, left_out, .. } = blocking({
            let store = store.clone();
            move || store.top_page(&query)
        })
        .await?;
        // Histograms are for the collector's own comparisons (Diff).
        digests.iter_mut().for_each(|d| d.histogram = None);
        let costs = blocking(move || store.costs(&costs_query)).await?;
        Ok(Response::new(TopResponse { digests, costs, quotas: self.quotas.report(now_unix_ms()), left_out }))
    }

    async fn diff(&self, request: Request<DiffRequest>) -> Result<Response<DiffResponse>, Status> {
        let request = request.into_inner();
        let range = |since_ms: i64, until_ms: i64, side: &str| -> Result<(i64, i64), Status> {
            let since_ms = since(since_ms).map_err(|e| Status::invalid_argument(format!("{side}: {}", e.message())))?;
            let until_ms =
                until(until_ms, since_ms).map_err(|e| Status::invalid_argument(format!("{side}: {}", e.message())))?;
            Ok((since_ms, until_ms))
        };
        let before = range(request.before_since_unix_ms, request.before_until_unix_ms, "before")?;
        let after = range(request.after_since_unix_ms, request.after_until_unix_ms, "after")?;
        let (before_range, after_range) = (before, after);
        let limit = limit(request.limit, diff::DEFAULT_LIMIT)?;
        let defaults = diff::Thresholds::default();
        if !(request.min_change.is_finite() && request.min_change >= 0.0) {
            return Err(Status::invalid_argument(format!("min_change: {} is not a ratio >= 0", request.min_change)));
        }
        let thresholds = diff::Thresholds {
            min_change: if request.min_change > 0.0 { request.min_change } else { defaults.min_change },
            min_delta_ns: if request.min_delta_ns > 0 { request.min_delta_ns } else { defaults.min_delta_ns },
            min_statements: if request.min_statements > 0 { request.min_statements } else { defaults.min_statements },
        };
        let query = |(since_unix_ms, until_unix_ms): (i64, i64)| TopQuery {
            instance: non_empty(request.instance.clone()),
            digest: None,
            schema: non_empty(request.schema.clone()),
            nested: false,
            program: None,
            since_unix_ms,
            until_unix_ms,
            order_by: OrderBy::Total,
            limit: MAX_LIMIT,
        };
        let (before_query, after_query) = (query(before), query(after));
        let now = now_unix_ms();
        let length = |(since_ms, until_ms): (i64, i64)| until_ms.min(now) - since_ms.max(0);
        let ranges_ms = (length(before), length(after));
        // Both sides at once, each read lean: every digest of two ranges.
        let (store, other) = (self.store.clone(), self.store.clone());
        let (before, after) = tokio::try_join!(
            blocking(move || store.top_lean(&before_query)),
            blocking(move || other.top_lean(&after_query))
        )?;
        let mut digests: Vec<_> =
            diff::compare(&before, &after, ranges_ms, thresholds).into_iter().take(limit).collect();
        // The changes after the first range ended, up to the second's end.
        let between = (before_range.1.min(after_range.0), after_range.1.min(now));
        let (store, instance) = (self.store.clone(), non_empty(request.instance.clone()));
        let digests = blocking(move || {
            blame::name_changes(store.as_ref(), instance.as_deref(), between, &mut digests)?;
            Ok(digests)
        })
        .await?;
        Ok(Response::new(DiffResponse { digests }))
    }

    async fn events(&self, request: Request<EventsRequest>) -> Result<Response<EventsResponse>, Status> {
        let query = events_query(request.into_inner())?;
        let store = self.store.clone();
        Ok(Response::new(EventsResponse { events: blocking(move || store.events(&query)).await? }))
    }

    async fn annotations(&self, request: Request<AnnotationsRequest>) -> Result<Response<AnnotationsResponse>, Status> {
        let query = annotations_query(request.into_inner())?;
        let store = self.store.clone();
        Ok(Response::new(AnnotationsResponse { annotations: blocking(move || store.annotations(&query)).await? }))
    }

    async fn replication(&self, request: Request<ReplicationRequest>) -> Result<Response<ReplicationResponse>, Status> {
        let request = request.into_inner();
        let since_unix_ms = since(request.since_unix_ms)?;
        let until_unix_ms = until(request.until_unix_ms, since_unix_ms)?;
        let instance = non_empty(request.instance);
        let store = self.store.clone();
        let replicas = blocking(move || {
            let mut answers = replication::Answers::default();
            store.replication_each(instance.as_deref(), since_unix_ms, until_unix_ms, &mut |w| answers.add(w))?;
            let mut replicas = answers.finish();
            // Applied statements are the instance's, whatever their
            // channel: they go with its first answer.
            let mut instance_done: Option<String> = None;
            for replica in &mut replicas {
                if instance_done.as_ref() == Some(&replica.instance) {
                    continue;
                }
                replica.digests =
                    replication::digests(store.as_ref(), &replica.instance, since_unix_ms, until_unix_ms)?;
                instance_done = Some(replica.instance.clone());
            }
            Ok(replicas)
        })
        .await?;
        Ok(Response::new(ReplicationResponse { replicas }))
    }

    async fn instances(&self, _request: Request<InstancesRequest>) -> Result<Response<InstancesResponse>, Status> {
        let store = self.store.clone();
        let instances = blocking(move || store.instances()).await?;
        Ok(Response::new(InstancesResponse { instances }))
    }

    async fn totals(&self, request: Request<TotalsRequest>) -> Result<Response<TotalsResponse>, Status> {
        let request = request.into_inner();
        let since_unix_ms = since(request.since_unix_ms)?;
        let query = TotalsQuery {
            instance: non_empty(request.instance),
            since_unix_ms,
            until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
        };
        let store = self.store.clone();
        Ok(Response::new(blocking(move || store.totals(&query)).await?))
    }

    async fn locks(&self, request: Request<LocksRequest>) -> Result<Response<LocksResponse>, Status> {
        let query = locks_query(request.into_inner())?;
        let store = self.store.clone();
        let page = blocking(move || store.locks_page(&query)).await?;
        Ok(Response::new(LocksResponse { waits: page.rows, left_out: page.left_out }))
    }

    async fn long_statements(
        &self,
        request: Request<LongStatementsRequest>,
    ) -> Result<Response<LongStatementsResponse>, Status> {
        let request = request.into_inner();
        let query = locks_query(LocksRequest {
            instance: request.instance,
            since_unix_ms: request.since_unix_ms,
            limit: request.limit,
        })?;
        let store = self.store.clone();
        let page = blocking(move || store.long_statements_page(&query)).await?;
        Ok(Response::new(LongStatementsResponse { statements: page.rows, left_out: page.left_out }))
    }

    async fn plans(&self, request: Request<PlansRequest>) -> Result<Response<PlansResponse>, Status> {
        let query = plans_query(request.into_inner())?;
        let store = self.store.clone();
        let figures = query.digest.map(|digest| TopQuery {
            instance: query.instance.clone(),
            digest: Some(digest),
            schema: query.schema.clone(),
            nested: true,
            program: None,
            since_unix_ms: query.since_unix_ms,
            until_unix_ms: query.until_unix_ms,
            order_by: OrderBy::Total,
            limit: MAX_LIMIT,
        });
        let (mut answer, figures) = blocking(move || {
            let answer = store.plans(&query)?;
            let figures = match figures {
                Some(top) if !answer.plans.is_empty() => store.top(&top)?,
                _ => Vec::new(),
            };
            Ok((answer, figures))
        })
        .await?;
        // The newest plan of each (instance, schema) is judged; rows come
        // newest first.
        let mut judged = std::collections::HashSet::new();
        for row in &mut answer.plans {
            let Some(plan) = &row.plan else { continue };
            if !judged.insert((row.instance.clone(), plan.schema.clone())) {
                continue;
            }
            let mine = figures.iter().filter(|d| d.schema == plan.schema && !d.nested);
            let (count, stats) =
                mine.fold((0, None), |(count, stats): (u64, Option<sqlbee_proto::v1::QueryStats>), d| {
                    let mut merged = stats.unwrap_or_default();
                    if let Some(s) = &d.stats {
                        merged.merge(s);
                    }
                    (count + d.count, Some(merged))
                });
            row.findings = findings::findings(plan, count, stats.as_ref());
        }
        Ok(Response::new(answer))
    }

    async fn activity(&self, request: Request<ActivityRequest>) -> Result<Response<ActivityResponse>, Status> {
        let request = request.into_inner();
        let instance = non_empty(request.instance);
        let page = self.live.get(instance.as_deref(), request.min_running_ms, now_unix_ms());
        Ok(Response::new(ActivityResponse { instances: page.rows, left_out: page.left_out }))
    }

    async fn tables(&self, request: Request<TablesRequest>) -> Result<Response<TablesResponse>, Status> {
        let request = request.into_inner();
        let since_unix_ms = since(request.since_unix_ms)?;
        let limit = limit(request.limit, DEFAULT_LOCKS_LIMIT)?;
        // Statements stored programs ran count for the tables they touch;
        // the CALL that ran them touches none.
        let query = TopQuery {
            instance: non_empty(request.instance),
            digest: None,
            schema: None,
            nested: true,
            program: None,
            until_unix_ms: until(request.until_unix_ms, since_unix_ms)?,
            since_unix_ms,
            order_by: OrderBy::Total,
            limit: MAX_LIMIT,
        };
        let store = self.store.clone();
        let answer = blocking(move || {
            // Counts, time and rows examined are all a table needs.
            let rows = store.top_lean(&query)?;
            let mut digests: Vec<u64> = rows.iter().map(|r| r.digest).collect();
            digests.sort_unstable();
            digests.dedup();
            let described = store.digest_tables(&digests)?;
            // What replicas applied, merged over every instance asked.
            let mut applied = replication::Merged::default();
            store.replication_each(query.instance.as_deref(), query.since_unix_ms, query.until_unix_ms, &mut |w| {
                applied.add(&w.replication)
            })?;
            let applied = applied.finish().tables;
            let mut answer = tables::totals(&rows, &described, &applied, limit);
            // Indexes and what to do about them: from the definitions
            // agents read and the plans in force over the range.
            let instance = query.instance.as_deref();
            let indexes = store.table_indexes(instance)?;
            if !indexes.is_empty() {
                let plans = store.plans_of(&digests, instance, query.until_unix_ms)?;
                let evidence = index_advice::Evidence {
                    rows: &rows,
                    described: &described,
                    indexes: &indexes,
                    plans: &plans,
                    since_unix_ms: query.since_unix_ms,
                };
                index_advice::advise(&mut answer.tables, &evidence);
                // The digests' candidate indexes, judged with their full
                // figures (the lean rows lack rows sent).
                let mut judged = Vec::new();
                for plan in index_advice::candidate_plans(&plans, &rows) {
                    let one = TopQuery {
                        digest: Some(plan.digest),
                        schema: Some(plan.schema.clone()),
                        limit: 1,
                        ..query.clone()
                    };
                    if let Some(row) = store.top(&one)?.into_iter().next() {
                        judged.push((plan, row));
                    }
                }
                index_advice::gather_candidates(&mut answer.tables, &judged);
            }
            Ok(answer)
        })
        .await?;
        Ok(Response::new(answer))
    }

    async fn hosts(&self, request: Request<HostsRequest>) -> Result<Response<HostsResponse>, Status> {
        let request = request.into_inner();
        let query = HostsQuery {
            host: non_empty(request.host),
            since_unix_ms: since(request.since_unix_ms)?,
            limit: limit(request.limit, DEFAULT_HOSTS_LIMIT)?,
        };
        let store = self.store.clone();
        let windows = blocking(move || store.hosts(&query)).await?;
        Ok(Response::new(HostsResponse { windows }))
    }

    async fn series(&self, request: Request<SeriesRequest>) -> Result<Response<SeriesResponse>, Status> {
        let mut request = request.into_inner();
        let by_instance = request.by_instance;
        let by_digests = std::mem::take(&mut request.by_digests);
        let query = series_query(request, now_unix_ms())?;
        let step_ms = query.step_ms;
        let store = self.store.clone();
        let empty = SeriesResponse { step_ms, ..SeriesResponse::default() };
        if by_instance && !by_digests.is_empty() {
            return Err(Status::invalid_argument("by_instance, by_digests: a series splits one way at a time"));
        }
        if by_instance {
            if matches!(query.of, SeriesOf::Cost) {
                return Err(Status::invalid_argument(
                    "by_instance: only of = digest or statements is split by instance",
                ));
            }
            let instances = blocking(move || store.series_by_instance(&query)).await?;
            return Ok(Response::new(SeriesResponse { instances, ..empty }));
        }
        if !by_digests.is_empty() {
            if query.of != SeriesOf::Statements {
                return Err(Status::invalid_argument("by_digests: only of = statements is split by digest"));
            }
            if by_digests.len() > MAX_SPLIT_DIGESTS {
                return Err(Status::invalid_argument(format!(
                    "by_digests: {} digests, more than {MAX_SPLIT_DIGESTS} in one read",
                    by_digests.len()
                )));
            }
            let digests = blocking(move || store.series_by_digest(&query, &by_digests)).await?;
            return Ok(Response::new(SeriesResponse { digests, ..empty }));
        }
        let points = blocking(move || store.series(&query)).await?;
        Ok(Response::new(SeriesResponse { points, ..empty }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<T: std::fmt::Debug>(result: Result<T, Status>) -> (tonic::Code, String) {
        let status = result.expect_err("refused");
        (status.code(), status.message().to_string())
    }

    #[test]
    fn a_top_request_gets_defaults_and_is_held_to_its_limits() {
        let query = top_query(TopRequest::default()).unwrap();
        assert_eq!(
            (query.limit, query.order_by, query.since_unix_ms, query.until_unix_ms),
            (20, OrderBy::Total, 0, i64::MAX)
        );
        assert_eq!((query.instance, query.digest, query.schema), (None, None, None));
        let asked =
            TopRequest { limit: 10_000, order_by: "p99".into(), instance: "db:3306".into(), ..Default::default() };
        let query = top_query(asked).unwrap();
        assert_eq!((query.limit, query.order_by, query.instance.as_deref()), (10_000, OrderBy::P99, Some("db:3306")));
        let (c, m) = code(top_query(TopRequest { limit: 10_001, ..Default::default() }));
        assert!(c == tonic::Code::InvalidArgument && m.contains("limit"), "{m}");
        let (_, m) = code(top_query(TopRequest { order_by: "fastest".into(), ..Default::default() }));
        assert!(m.contains("order_by") && m.contains("rows_examined"), "names the keys: {m}");
        let (_, m) = code(top_query(TopRequest { since_unix_ms: -1, ..Default::default() }));
        assert!(m.contains("since_unix_ms"), "{m}");
        let (_, m) = code(top_query(TopRequest { since_unix_ms: 5, until_unix_ms: 5, ..Default::default() }));
        assert!(m.contains("until_unix_ms"), "{m}");
    }

    #[test]
    fn a_series_gets_a_step_the_rollups_can_answer_and_at_most_max_points() {
        let hour = 3_600_000;
        let request = |since, until, step| SeriesRequest {
            since_unix_ms: since,
            until_unix_ms: until,
            step_ms: step,
            ..Default::default()
        };
        let query = series_query(request(10 * hour, 11 * hour, 0), 0).unwrap();
        assert_eq!(query.step_ms, 60_000, "an hour in minutes");
        assert_eq!(query.since_unix_ms % query.step_ms, 0, "steps start on multiples of the step");
        let query = series_query(request(10 * hour, 10 * hour + 60 * 60_000 * 24 * 30, 0), 0).unwrap();
        assert_eq!(query.step_ms % hour, 0, "a month in whole hours or days");
        let (_, m) = code(series_query(request(0, hour, 0), 0));
        assert!(m.contains("needs a start"), "{m}");
        let (_, m) = code(series_query(request(1, 10 * hour, 1), 0));
        assert!(m.contains("points"), "{m}");
        let (_, m) = code(series_query(SeriesRequest { of: "digest".into(), ..request(1, hour, 0) }, 0));
        assert!(m.contains("digest id"), "{m}");
    }
}
