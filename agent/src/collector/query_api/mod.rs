//! The Query service: checks the request, asks the store on the blocking
//! pool. Owns the request defaults and limits (limit 20 digests or 100 lock
//! waits, at most 10 000).
pub mod client;

use std::sync::Arc;

use sqlbee_proto::v1::{
    HostsRequest, HostsResponse, InstancesRequest, InstancesResponse, LocksRequest, LocksResponse, TopRequest,
    TopResponse, TotalsRequest, TotalsResponse, query_server::Query,
};
use tonic::{Request, Response, Status};

use crate::collector::{
    store::{HostsQuery, LocksQuery, OrderBy, Store, TopQuery, TotalsQuery},
    store_task::blocking,
};

pub const DEFAULT_LIMIT: usize = 20;
pub const DEFAULT_LOCKS_LIMIT: usize = 100;
pub const DEFAULT_HOSTS_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 10_000;

pub struct QueryService {
    store: Arc<dyn Store>,
}

impl QueryService {
    pub fn new(store: Arc<dyn Store>) -> QueryService {
        QueryService { store }
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

pub fn top_query(request: TopRequest) -> Result<TopQuery, Status> {
    let order_by = OrderBy::parse(&request.order_by).ok_or_else(|| {
        Status::invalid_argument(format!(
            "order_by: unknown key {:?}; expected one of {}",
            request.order_by,
            OrderBy::NAMES.join(", ")
        ))
    })?;
    let limit = limit(request.limit, DEFAULT_LIMIT)?;
    Ok(TopQuery {
        instance: non_empty(request.instance),
        schema: non_empty(request.schema),
        nested: request.nested,
        program: non_empty(request.program),
        since_unix_ms: since(request.since_unix_ms)?,
        order_by,
        limit,
    })
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn top(&self, request: Request<TopRequest>) -> Result<Response<TopResponse>, Status> {
        let query = top_query(request.into_inner())?;
        let store = self.store.clone();
        let costs_query = TotalsQuery { instance: query.instance.clone(), since_unix_ms: query.since_unix_ms };
        let digests = blocking({
            let store = store.clone();
            move || store.top(&query)
        })
        .await?;
        let costs = blocking(move || store.costs(&costs_query)).await?;
        Ok(Response::new(TopResponse { digests, costs }))
    }

    async fn instances(&self, _request: Request<InstancesRequest>) -> Result<Response<InstancesResponse>, Status> {
        let store = self.store.clone();
        let instances = blocking(move || store.instances()).await?;
        Ok(Response::new(InstancesResponse { instances }))
    }

    async fn totals(&self, request: Request<TotalsRequest>) -> Result<Response<TotalsResponse>, Status> {
        let request = request.into_inner();
        let query = TotalsQuery { instance: non_empty(request.instance), since_unix_ms: since(request.since_unix_ms)? };
        let store = self.store.clone();
        Ok(Response::new(blocking(move || store.totals(&query)).await?))
    }

    async fn locks(&self, request: Request<LocksRequest>) -> Result<Response<LocksResponse>, Status> {
        let query = locks_query(request.into_inner())?;
        let store = self.store.clone();
        let waits = blocking(move || store.locks(&query)).await?;
        Ok(Response::new(LocksResponse { waits }))
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
}
