//! Activity snapshots to the collector: the newest one goes out at once,
//! to the first collector that takes it. Nothing is spooled or retried:
//! a snapshot a second old is replaced by the next one, and one lost
//! leaves only a gap of a second in a live view.
use std::time::Duration;

use sqlbee_proto::v1::{ActivityReport, AgentIdentity};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::sender::ingest_client;
use sqlbee_proto::client::ClientOptions;

/// A push that takes longer is given up: the next snapshot is due.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn push_activity(
    targets: Vec<ClientOptions>,
    agent: AgentIdentity,
    mut snapshots: watch::Receiver<Option<ActivityReport>>,
) {
    let mut clients = Vec::with_capacity(targets.len());
    for target in &targets {
        match ingest_client(target) {
            Ok(client) => clients.push(client),
            Err(e) => return warn!(collector = target.url, error = %e, "activity is not sent"),
        }
    }
    let mut failing = false;
    while snapshots.changed().await.is_ok() {
        let Some(mut report) = snapshots.borrow_and_update().clone() else { continue };
        report.agent = Some(agent.clone());
        let mut outcome = Err(String::new());
        let mut early = false;
        for client in &mut clients {
            let mut request = tonic::Request::new(report.clone());
            request.set_timeout(PUSH_TIMEOUT);
            match client.push_activity(request).await {
                Ok(_) => {
                    outcome = Ok(());
                    break;
                }
                // Activity follows an instance's windows: until the first
                // one is stored, the collector does not take it yet.
                Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                    early = true;
                    outcome = Err(format!("{}: {}", status.code(), status.message()));
                }
                Err(status) => outcome = Err(format!("{}: {}", status.code(), status.message())),
            }
        }
        if early && outcome.is_err() && !failing {
            debug!(why = outcome.as_ref().err(), "activity waits for the instances' first windows");
            continue;
        }
        match outcome {
            Ok(()) if failing => {
                failing = false;
                info!("activity reaches the collector again");
            }
            Ok(()) => {}
            Err(why) if !failing => {
                failing = true;
                warn!(why, "activity did not reach a collector; the next snapshot is tried as it comes");
            }
            Err(why) => debug!(why, "activity not delivered"),
        }
    }
}
