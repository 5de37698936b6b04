//! Maintenance runs on one elected worker per database, and another takes
//! over when the leader stops or dies.

use std::time::Duration;

use courier::{Maintenance, MaintenanceConfig, NewMessage, OutboxStore, SubscriptionSpec};
use courier_testkit::{backend_tests, eventually, Backend, Event};
use tokio_util::sync::CancellationToken;

/// Fast maintenance: rescue every 50 ms, a leader lease of `lease`.
fn fast(lease: Duration) -> MaintenanceConfig {
    MaintenanceConfig {
        rescue_interval: Duration::from_millis(50),
        leader_lease: lease,
        ..courier_testkit::rescue_at_once()
    }
}

async fn one_runner_leads_until_it_resigns_or_its_lease_runs_out<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    // A lease of 3 s: each step below takes a round trip or two, which a
    // loaded machine may stretch well past half a second.
    let first = Maintenance::new(
        backend.courier().store().clone(),
        fast(Duration::from_secs(3)),
    )?;
    let second = Maintenance::new(backend.another_store().await?, fast(Duration::from_secs(3)))?;
    assert!(first.lead().await?, "the first to try leads");
    assert!(!second.lead().await?, "a live lease is not taken over");
    assert!(first.lead().await?, "the leader renews its lease");
    second.resign().await?;
    assert!(
        !second.lead().await?,
        "resigning a lease one does not hold leaves it to its holder"
    );
    first.resign().await?;
    assert!(second.lead().await?, "a resigned lease is taken at once");
    assert!(!first.lead().await?);
    // The leader dies (stops renewing): its lease runs out on the database clock.
    assert!(
        eventually(Duration::from_secs(30), || async {
            first.lead().await.unwrap_or(false)
        })
        .await,
        "an expired lease is taken over"
    );
    assert!(!second.lead().await?);
    Ok(())
}

/// A running delivery with an expired lease, for the rescuer to find.
async fn an_expired_lease<B: Backend>(backend: &B) -> anyhow::Result<()> {
    let store = backend.courier().store();
    store
        .register_subscription(&SubscriptionSpec::new("sub", ["topic"]))
        .await?;
    backend
        .enqueue_committed(&[NewMessage::new("acme", "topic", &Event { n: 1 })?])
        .await?;
    let claimed = store
        .claim(&courier::ClaimParams {
            subscription: "sub".into(),
            routes: vec![courier::Route {
                topic: "topic".into(),
                schema_version: 1,
                max_attempts: 10,
            }],
            limit: 1,
            lease: Duration::from_secs(60),
            worker_id: "crashed".into(),
            tenant_cursor: String::new(),
            tenant_in_flight_limit: None,
        })
        .await?;
    anyhow::ensure!(claimed.deliveries.len() == 1, "claimed the message");
    backend.expire_leases().await?;
    Ok(())
}

async fn only_the_leader_rescues_and_a_follower_takes_over_when_it_stops<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    an_expired_lease(&backend).await?;
    // Another runner (as another process) holds the lease and does nothing.
    let idle_leader = Maintenance::new(
        backend.another_store().await?,
        fast(Duration::from_secs(60)),
    )?;
    assert!(idle_leader.lead().await?);

    let runner = Maintenance::new(
        backend.courier().store().clone(),
        fast(Duration::from_secs(60)),
    )?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(runner.clone().run(stop.clone()));
    let running_rows = || async {
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE state = 'running'")
            .await
            .unwrap_or(-1)
    };
    // Twenty rescue intervals: a runner that is not the leader never rescues.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(running_rows().await, 1, "a follower rescued");

    idle_leader.resign().await?;
    assert!(
        eventually(Duration::from_secs(5), || async {
            running_rows().await == 0
        })
        .await,
        "the follower took over and rescued once the leader resigned"
    );
    assert!(!idle_leader.lead().await?, "the new leader holds the lease");
    stop.cancel();
    running.await?;
    assert!(
        idle_leader.lead().await?,
        "a runner that stops resigns, so another leads at once"
    );
    Ok(())
}

backend_tests!(
    one_runner_leads_until_it_resigns_or_its_lease_runs_out,
    only_the_leader_rescues_and_a_follower_takes_over_when_it_stops,
);
