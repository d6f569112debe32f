//! `GET /server_info` (version, phase, configuration and the counters as JSON) and `GET /metrics`
//! (Prometheus text), both written from the metric table.

use crate::{Phase, Shared};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub(crate) async fn server_info(State(state): State<Shared>) -> axum::Json<Value> {
    let snapshot = state
        .loaded()
        .map(|l| l.engine.stats().snapshot())
        .unwrap_or_default();
    let phase = match state.phase() {
        Phase::Loading => "loading",
        Phase::Ready => "ready",
        Phase::Draining => "draining",
    };
    let config = state.loaded().map(|l| l.engine.config());
    let mut info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "served_model_name": state.served_model_name,
        "phase": phase,
        "config": state.info,
    });
    let Value::Object(map) = &mut info else {
        unreachable!("an object")
    };
    let host_blocks_total = config.map_or(0, |c| c.host_cache_blocks);
    let enabled = config.is_some_and(|c| c.prefix_cache);
    counters(
        map,
        &state.metrics.sources(&snapshot, host_blocks_total),
        enabled,
    );
    axum::Json(info)
}

/// The counter sections of `/server_info`: `stats`, `prefix_cache` (which says first whether it is
/// `enabled`) and `speculative`.
pub(crate) fn counters(
    info: &mut serde_json::Map<String, Value>,
    sources: &crate::metrics::table::Sources<'_>,
    prefix_cache: bool,
) {
    info.insert("stats".into(), json!({}));
    info.insert("prefix_cache".into(), json!({ "enabled": prefix_cache }));
    info.insert("speculative".into(), json!({}));
    crate::metrics::server_info(info, sources);
}

pub(crate) async fn metrics(State(state): State<Shared>) -> Response {
    let text = state.metrics.render(
        &state
            .loaded()
            .map(|l| l.engine.stats().snapshot())
            .unwrap_or_default(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
