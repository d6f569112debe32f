//! `specula bench`: a parallel throughput benchmark for any OpenAI-compatible server.
//!
//! Data flow: [`workload`] picks prompts (each level its own slice) and arrival times, [`client`]
//! sends them and records each request, [`runner`] sweeps concurrency levels (reading the
//! server's [`server_metrics`] around each), [`stats`] and [`goodput`] aggregate, [`report`]
//! prints and saves, [`compare`] and [`plot`] read saved runs. [`mock`] is a server to test
//! against.

pub mod client;
pub mod compare;
pub mod config;
mod cpu;
pub mod goodput;
pub mod mock;
pub mod plot;
pub mod record;
pub mod report;
pub mod runner;
pub mod server_metrics;
pub mod stats;
pub mod workload;

pub use config::{BenchConfig, DatasetSpec, Endpoint};
pub use report::RunReport;
pub use runner::{Display, Sweep, run_sweep};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error(transparent)]
    Workload(#[from] workload::WorkloadError),
    #[error(transparent)]
    Report(#[from] report::ReportError),
    #[error("{0} lists no model (GET /v1/models): pass --model")]
    NoModel(String),
    #[error("cannot write the report: {0}")]
    Output(#[from] std::io::Error),
}

impl BenchError {
    /// The process exit code: 2 when the server cannot be reached, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Client(client::ClientError::Unreachable { .. }) => 2,
            _ => 1,
        }
    }
}
