//! The Query service: checks the request, asks the store on the blocking
//! pool. Owns the request defaults and limits (limit 20, at most 10 000).
use std::sync::Arc;

use sqlbee_proto::v1::{
    InstancesRequest, InstancesResponse, TopRequest, TopResponse, TotalsRequest, TotalsResponse, query_server::Query,
};
use tonic::{Request, Response, Status};

use super::{
    ingest::blocking,
    store::{OrderBy, Store, TopQuery, TotalsQuery},
};

pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 10_000;

pub struct QueryService {
    store: Arc<dyn Store>,
}

impl QueryService {
    pub fn new(store: Arc<dyn Store>) -> QueryService {
        QueryService { store }
    }
}

fn instance(name: String) -> Option<String> {
    if name.is_empty() { None } else { Some(name) }
}

fn since(ms: i64) -> Result<i64, Status> {
    if ms < 0 {
        return Err(Status::invalid_argument(format!("since_unix_ms: {ms} is negative; 0 means all")));
    }
    Ok(ms)
}

pub fn top_query(request: TopRequest) -> Result<TopQuery, Status> {
    let order_by = OrderBy::parse(&request.order_by).ok_or_else(|| {
        Status::invalid_argument(format!(
            "order_by: unknown key {:?}; expected one of {}",
            request.order_by,
            OrderBy::NAMES.join(", ")
        ))
    })?;
    let limit = match request.limit as usize {
        0 => DEFAULT_LIMIT,
        n if n > MAX_LIMIT => {
            return Err(Status::invalid_argument(format!("limit: {n} is above the maximum {MAX_LIMIT}")));
        }
        n => n,
    };
    Ok(TopQuery { instance: instance(request.instance), since_unix_ms: since(request.since_unix_ms)?, order_by, limit })
}

#[tonic::async_trait]
impl Query for QueryService {
    async fn top(&self, request: Request<TopRequest>) -> Result<Response<TopResponse>, Status> {
        let query = top_query(request.into_inner())?;
        let store = self.store.clone();
        let digests = blocking(move || store.top(&query)).await?;
        Ok(Response::new(TopResponse { digests }))
    }

    async fn instances(&self, _request: Request<InstancesRequest>) -> Result<Response<InstancesResponse>, Status> {
        let store = self.store.clone();
        let instances = blocking(move || store.instances()).await?;
        Ok(Response::new(InstancesResponse { instances }))
    }

    async fn totals(&self, request: Request<TotalsRequest>) -> Result<Response<TotalsResponse>, Status> {
        let request = request.into_inner();
        let query = TotalsQuery { instance: instance(request.instance), since_unix_ms: since(request.since_unix_ms)? };
        let store = self.store.clone();
        Ok(Response::new(blocking(move || store.totals(&query)).await?))
    }

    async fn locks(
        &self,
        _request: Request<sqlbee_proto::v1::LocksRequest>,
    ) -> Result<Response<sqlbee_proto::v1::LocksResponse>, Status> {
        Err(Status::unimplemented("lock waits are not stored yet"))
    }
}
