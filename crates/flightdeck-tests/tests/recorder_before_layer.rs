//! The recorder is installed first, the layer built after: a scrape before
//! the first request shows every stage's state. One test per binary: a
//! process has one global recorder.

#[path = "recorder_order/check.rs"]
mod check;
mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_installed_before_the_layer_sees_every_stage_before_any_request() {
    common::metrics_on();
    let layer = check::layer();
    check::exported_before_any_request().await;
    drop(layer);
}
