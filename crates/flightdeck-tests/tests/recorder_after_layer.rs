//! The layer is built first, the recorder installed after (as the axum
//! example does): a scrape before the first request already shows every
//! stage's state. One test per binary: a process has one global recorder.

#[path = "recorder_order/check.rs"]
mod check;
mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_installed_after_the_layer_sees_every_stage_before_any_request() {
    let layer = check::layer();
    common::metrics_on();
    check::exported_before_any_request().await;
    drop(layer);
}
