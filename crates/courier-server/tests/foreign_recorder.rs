//! A process whose metrics recorder was installed by someone else still gets
//! a working router and `/metrics` (its own test binary: the recorder is global).
#![allow(missing_docs)]

mod common;

use axum::http::StatusCode;

#[tokio::test]
async fn the_router_works_when_another_recorder_was_installed_first() {
    metrics::set_global_recorder(metrics::NoopRecorder).unwrap();
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let store = courier_testkit::Backend::courier(&fixture).store().clone();
    let app = common::app(store, &[], 1024);
    let published = common::post(&app, "/v1/messages", None, &common::message("a", "t")).await;
    assert_eq!(published.status, StatusCode::CREATED);
    let metrics = common::get(&app, "/metrics", None).await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.text);
    assert!(metrics.content_type.starts_with("text/plain"));
}
