//! `GET /server_info` (version, phase, configuration and the counters as JSON) and `GET /metrics`
//! (Prometheus text), both written from the metric table.

use crate::metrics::table::Sources;
use crate::{Phase, Shared};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// What the server runs and how it is doing, as JSON.
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
    let mut info = Map::new();
    info.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    info.insert(
        "served_model_name".into(),
        state.served_model_name.clone().into(),
    );
    info.insert("phase".into(), phase.into());
    info.insert("config".into(), state.info.clone());
    let host_blocks_total = config.map_or(0, |c| c.host_cache_blocks);
    let sources = state.metrics.sources(&snapshot, host_blocks_total);
    counters(&mut info, &sources, config.is_some_and(|c| c.prefix_cache));
    axum::Json(Value::Object(info))
}

/// The counter sections of `/server_info`: `stats`, `prefix_cache` (which says first whether it is
/// `enabled`) and `speculative`.
pub(crate) fn counters(info: &mut Map<String, Value>, sources: &Sources<'_>, prefix_cache: bool) {
    info.insert("stats".into(), json!({}));
    info.insert("prefix_cache".into(), json!({ "enabled": prefix_cache }));
    info.insert("speculative".into(), json!({}));
    crate::metrics::server_info(info, sources);
    let drafters: Map<String, Value> = sources
        .engine
        .spec_drafters
        .iter()
        .flatten()
        .map(|(a, c)| {
            let figures = json!({
                "verifications": c.chosen,
                "proposed": c.proposed,
                "accepted": c.accepted,
            });
            (a.label().to_string(), figures)
        })
        .collect();
    info["speculative"]["drafters"] = Value::Object(drafters);
}

/// The Prometheus text exposition.
pub(crate) async fn metrics(State(state): State<Shared>) -> Response {
    let text = state.metrics.render(
        &state
            .loaded()
            .map(|l| l.engine.stats().snapshot())
            .unwrap_or_default(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
