//! `specula serve` as the end-to-end tests drive it: the real binary on a free loopback port,
//! and small HTTP helpers.

use super::model_path;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_specula");

/// A `specula serve` process on a free port, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub lines: mpsc::Receiver<String>,
}

impl Server {
    pub fn start(args: &[&str]) -> Self {
        let mut command = Self::command();
        command.arg("--model-path").arg(model_path()).args(args);
        Self::spawn(command)
    }

    /// `specula serve` on port 0 with 2 threads, quiet; no model given yet.
    pub fn command() -> Command {
        let mut command = Command::new(BIN);
        command.args([
            "serve",
            "--port",
            "0",
            "--threads",
            "2",
            "--log-level",
            "warning",
        ]);
        command
    }

    /// Starts `command` (a `specula serve`) and waits until it is ready.
    #[allow(clippy::zombie_processes)] // Drop kills and waits
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start specula serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the server did not become ready");
            if let Some(rest) = line.strip_prefix("specula serve: ready on ") {
                let url = rest.split_whitespace().next().unwrap().to_string();
                return Self { child, url, lines };
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit; its exit status.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::new()
}

pub async fn post(url: &str, body: Value) -> (u16, Value) {
    let r = client().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE response, until `[DONE]` (included).
pub async fn sse_events(response: reqwest::Response) -> Vec<String> {
    let body = response.text().await.unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// A GET route's JSON body.
pub async fn get_json(server: &Server, path: &str) -> Value {
    let r = client().get(server.url(path)).send().await.unwrap();
    r.json().await.unwrap()
}

/// A metric's value from the Prometheus text.
pub async fn metric(server: &Server, name: &str) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("specula:{name} ")))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse()
        .unwrap()
}

pub fn chat_body(content: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": content}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}
