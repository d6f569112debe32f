//! End-to-end tests of `specula bench`: the real binary against the real mock server, on loopback.

use regex::Regex;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_specula");

/// A `specula bench mock-server` process on a free port, killed on drop.
struct Mock {
    child: Child,
    url: String,
}

impl Mock {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["bench", "mock-server", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mock server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read mock address");
        let url = line
            .trim()
            .strip_prefix("mock server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Self { child, url }
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bench(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["bench", "--base-url", url])
        .args(args)
        .output()
        .expect("run specula bench")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn load(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read JSON")).expect("valid JSON")
}

/// The records of level `i` of a saved run.
fn requests(run: &Value, i: usize) -> &Vec<Value> {
    run["levels"][i]["requests"].as_array().expect("requests")
}

const LEVEL_LINE: &str = r"^  C=\s*(\d+) \| (\d+) requests \| throughput:\s+(\d+\.\d) tok/s \| per-req:\s+(\d+\.\d) tok/s \| latency avg/p50/p99:\s+(\d+\.\d)/\s*(\d+\.\d)/\s*(\d+\.\d)s \| ok: (\d+)/(\d+)$";

#[test]
fn prints_the_documented_header_and_one_line_per_level() {
    let mock = Mock::start(&["--tokens-per-second", "2000", "--ttft-ms", "5"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "1,3",
            "--requests-per-level",
            "6",
            "--max-tokens",
            "12",
            "--warmup-requests",
            "2",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Parallel throughput benchmark");
    assert_eq!(lines[1], format!("  Server: {}", mock.url));
    assert!(text.contains("\n  Max tokens: 12\n"), "{text}");
    assert!(text.contains("\n  Concurrency levels: [1, 3]\n"), "{text}");
    assert!(
        text.contains("\n  Warming up with 2 requests...\n  Warmup done.\n"),
        "{text}"
    );
    let re = Regex::new(LEVEL_LINE).unwrap();
    let levels: Vec<regex::Captures> = lines.iter().filter_map(|l| re.captures(l)).collect();
    assert_eq!(levels.len(), 2, "{text}");
    for (caps, c) in levels.iter().zip([1, 3]) {
        assert_eq!(&caps[1], c.to_string());
        assert_eq!((&caps[2], &caps[8], &caps[9]), ("6", "6", "6"));
        let throughput: f64 = caps[3].parse().unwrap();
        assert!(throughput > 0.0);
    }
    // The concurrency cap holds: never more requests in flight than the level allows.
    let run = load(&json);
    for (i, cap) in [(0, 1), (1, 3)] {
        let spans: Vec<(f64, f64)> = requests(&run, i)
            .iter()
            .map(|r| {
                let s = r["start_s"].as_f64().unwrap();
                (s, s + r["latency_s"].as_f64().unwrap())
            })
            .collect();
        for &(s, _) in &spans {
            let in_flight = spans.iter().filter(|&&(a, b)| a <= s && s < b).count();
            assert!(in_flight <= cap, "{in_flight} in flight at C={cap}");
        }
    }
}

#[test]
fn token_counts_come_from_usage_exactly() {
    let mock = Mock::start(&["--tokens-per-second", "3000", "--ttft-ms", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "2,4",
            "--requests-per-level",
            "8",
            "--max-tokens",
            "12",
            "--warmup-requests",
            "0",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    let run = load(&json);
    for i in 0..2 {
        assert_eq!(run["levels"][i]["stats"]["completion_tokens"], 8 * 12);
        for r in requests(&run, i) {
            assert_eq!(r["completion_tokens"], 12);
            assert_eq!(
                r["content_chunks"], 12,
                "the role-only chunk is not a token"
            );
            assert_eq!(r["usage_reported"], true);
            assert_eq!(r["finish_reason"], "length");
            assert_eq!(r["itl_s"].as_array().unwrap().len(), 11);
        }
    }
    assert!(!stdout(&out).contains("note:") && !stdout(&out).contains("warning:"));
}

#[test]
fn without_usage_chunks_are_counted_and_said_once() {
    let mock = Mock::start(&["--tokens-per-second", "3000", "--no-usage"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "9",
            "--warmup-requests",
            "0",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    assert_eq!(
        stdout(&out).matches("the server sent no usage").count(),
        1,
        "{}",
        stdout(&out)
    );
    let run = load(&json);
    assert_eq!(run["levels"][1]["stats"]["completion_tokens"], 4 * 9);
    assert_eq!(requests(&run, 0)[0]["usage_reported"], false);
}

#[test]
fn multi_token_chunks_warn_that_usage_and_chunks_differ() {
    // Three tokens a chunk, as a speculative server streams them: usage says 12, chunks say 4.
    let mock = Mock::start(&["--tokens-per-second", "3000", "--tokens-per-chunk", "3"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "12",
            "--warmup-requests",
            "0",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    let text = stdout(&out);
    assert_eq!(text.matches("warning:").count(), 1, "{text}");
    assert!(text.contains("usage and content-chunk counts more than 10% apart"));
    let run = load(&json);
    let r = &requests(&run, 0)[0];
    assert_eq!(
        (
            r["completion_tokens"].as_u64(),
            r["content_chunks"].as_u64()
        ),
        (Some(12), Some(4))
    );
}

#[test]
fn percentiles_match_a_known_ttft_distribution() {
    // The mock spreads TTFT evenly over [100, 1000] ms across each 100 requests, so the exact
    // percentiles are 100 + 900 q ms; the client can only add (small) network time.
    let mock = Mock::start(&[
        "--tokens-per-second",
        "1000",
        "--ttft-ms",
        "100",
        "--ttft-jitter-ms",
        "900",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "100",
            "--requests-per-level",
            "100",
            "--max-tokens",
            "2",
            "--warmup-requests",
            "0",
            "--output",
            json.to_str().unwrap(),
            "--verbose",
        ],
    );
    assert_success(&out);
    assert!(stdout(&out).contains("TTFT avg/p50/p90/p99:"));
    let ttft = &load(&json)["levels"][0]["stats"]["ttft_s"];
    for (key, expected) in [("avg", 0.55), ("p50", 0.55), ("p90", 0.91), ("p99", 0.991)] {
        let got = ttft[key].as_f64().unwrap();
        assert!(
            got >= expected - 0.002 && got < expected + 0.08,
            "TTFT {key}: {got} s, expected {expected} s"
        );
    }
}

#[test]
fn poisson_arrivals_follow_the_requested_rate() {
    let mock = Mock::start(&["--tokens-per-second", "5000", "--ttft-ms", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "1000",
            "--requests-per-level",
            "800",
            "--max-tokens",
            "2",
            "--warmup-requests",
            "0",
            "--request-rate",
            "400",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    assert!(stdout(&out).contains("Request rate: 400 req/s (Poisson)"));
    let starts: Vec<f64> = requests(&load(&json), 0)
        .iter()
        .map(|r| r["start_s"].as_f64().unwrap())
        .collect();
    let span = starts.iter().cloned().fold(0.0, f64::max)
        - starts.iter().cloned().fold(f64::MAX, f64::min);
    let rate = (starts.len() - 1) as f64 / span;
    assert!(
        (rate - 400.0).abs() < 40.0,
        "measured arrival rate {rate:.1}/s"
    );
}

/// Runs a level of 6 requests against a mock whose every second request fails with `fault`.
fn faulty_run(fault: &str, extra: &[&str]) -> (String, Value) {
    let mock = Mock::start(&[
        "--tokens-per-second",
        "2000",
        "--fault",
        fault,
        "--fault-every",
        "2",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut args = vec![
        "--concurrency",
        "2",
        "--requests-per-level",
        "6",
        "--max-tokens",
        "10",
        "--warmup-requests",
        "0",
        "--output",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = bench(&mock.url, &args);
    assert_success(&out);
    (stdout(&out), load(&json))
}

fn assert_fault_class(fault: &str, class: &str, shown: &str, message_part: &str, extra: &[&str]) {
    let (text, run) = faulty_run(fault, extra);
    assert!(text.contains("| ok: 3/6"), "{fault}: {text}");
    assert_eq!(
        text.matches(&format!("first {shown} error:")).count(),
        1,
        "{text}"
    );
    let failed: Vec<&Value> = requests(&run, 0)
        .iter()
        .filter(|r| !r["error"].is_null())
        .collect();
    assert_eq!(failed.len(), 3);
    for r in failed {
        assert_eq!(r["error"]["class"], class, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(message_part), "{fault}: {msg}");
    }
    assert_eq!(run["levels"][0]["stats"]["errors"][class], 3);
}

#[test]
fn http_errors_are_classified_with_the_server_message() {
    assert_fault_class(
        "http500",
        "http_status",
        "http status",
        "HTTP 500: mock: injected failure",
        &[],
    );
}

#[test]
fn dropped_streams_are_classified() {
    assert_fault_class("drop", "broken_stream", "broken stream", "", &[]);
}

#[test]
fn invalid_json_is_classified() {
    assert_fault_class("bad-json", "bad_json", "bad json", "oops", &[]);
}

#[test]
fn hung_requests_time_out() {
    assert_fault_class(
        "hang",
        "timeout",
        "timeout",
        "within 1.0s",
        &["--timeout", "1"],
    );
}

#[test]
fn unreachable_server_exits_2_before_warming_up() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = bench(&format!("http://127.0.0.1:{port}"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: server http://127.0.0.1:") && err.contains("unreachable"),
        "{err}"
    );
    assert!(!stdout(&out).contains("Warming up"));
}

#[test]
fn bad_flags_get_a_one_line_error() {
    for args in [
        &["--concurrency", "0"][..],
        &["--extra-body", "not json"],
        &["--dataset", "random:0"],
        &["--header", "novalue"],
        &["--timeout=0"],
        &["--goodput", "ttft"],
        &["--goodput", "itl:5"],
        &["--goodput", "ttft:100", "--no-stream"],
    ] {
        let out = bench("http://127.0.0.1:9", args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
    }
    let missing = bench(
        "http://127.0.0.1:9",
        &["--dataset", "/nonexistent/prompts.jsonl"],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/prompts.jsonl"));
}

#[test]
fn eos_is_ignored_by_default_and_honoured_on_request() {
    let mock = Mock::start(&["--tokens-per-second", "3000", "--eos-after", "4"]);
    let dir = tempfile::tempdir().unwrap();
    for (flag, tokens, finish) in [
        (None, 10, "length"),
        (Some("--disable-ignore-eos"), 4, "stop"),
    ] {
        let json = dir.path().join("run.json");
        let mut args = vec![
            "--concurrency",
            "2",
            "--requests-per-level",
            "2",
            "--max-tokens",
            "10",
            "--warmup-requests",
            "0",
            "--output",
            json.to_str().unwrap(),
        ];
        args.extend(flag);
        assert_success(&bench(&mock.url, &args));
        let run = load(&json);
        let r = &requests(&run, 0)[0];
        assert_eq!(r["completion_tokens"], tokens);
        assert_eq!(r["finish_reason"], finish);
    }
}

#[test]
fn api_key_and_headers_reach_the_server() {
    let mock = Mock::start(&["--tokens-per-second", "3000", "--require-api-key", "s3cret"]);
    let args = [
        "--concurrency",
        "1",
        "--requests-per-level",
        "2",
        "--max-tokens",
        "3",
        "--warmup-requests",
        "0",
    ];
    let denied = bench(&mock.url, &args);
    assert_eq!(denied.status.code(), Some(1), "no request succeeded");
    assert!(
        stdout(&denied)
            .contains("first http status error: HTTP 401: mock: missing or wrong API key")
    );
    let by_env = Command::new(BIN)
        .args(["bench", "--base-url", &mock.url])
        .args(args)
        .env("OPENAI_API_KEY", "s3cret")
        .output()
        .unwrap();
    assert_success(&by_env);
    let by_header = bench(
        &mock.url,
        &[&args[..], &["--header", "Authorization: Bearer s3cret"]].concat(),
    );
    assert_success(&by_header);
    assert!(stdout(&by_header).contains("| ok: 2/2"));
}

#[test]
fn completions_endpoint_without_streaming() {
    let mock = Mock::start(&["--tokens-per-second", "3000"]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = bench(
        &mock.url,
        &[
            "--endpoint",
            "completions",
            "--no-stream",
            "--concurrency",
            "2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "7",
            "--warmup-requests",
            "1",
            "--dataset",
            "random:32",
            "--output",
            json.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    assert!(stdout(&out).contains("| ok: 4/4"));
    assert!(
        !stdout(&out).contains("warning:"),
        "a whole response is not a multi-token chunk"
    );
    let run = load(&json);
    let r = &requests(&run, 0)[0];
    assert_eq!(r["completion_tokens"], 7);
    assert!(r["ttft_s"].is_null(), "no TTFT without streaming");
    assert_eq!(run["config"]["endpoint"], "completions");
}

/// What the mock received, one letter per event: `p` a prompt, `F` a cache flush, `m` a
/// metrics read; and the prompts in order.
fn mock_log(mock: &Mock) -> (String, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let events: Vec<Value> = rt.block_on(async {
        reqwest::get(format!("{}/mock/log", mock.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let shape = events
        .iter()
        .map(|e| match e["kind"].as_str().unwrap() {
            "prompt" => 'p',
            "flush" => 'F',
            _ => 'm',
        })
        .collect();
    let prompts = events
        .iter()
        .filter_map(|e| e["text"].as_str().map(str::to_string))
        .collect();
    (shape, prompts)
}

#[test]
fn levels_send_their_own_prompts_flush_read_server_counters_and_report_goodput() {
    let mock = Mock::start(&[
        "--tokens-per-second",
        "4000",
        "--ttft-ms",
        "1",
        "--metrics",
        "--flush-cache",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let csv = dir.path().join("run.csv");
    let out = bench(
        &mock.url,
        &[
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "5",
            "--warmup-requests",
            "1",
            "--flush-cache",
            "--goodput",
            "ttft:10000",
            "e2e:60000",
            "--verbose",
            "--output",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
        ],
    );
    assert_success(&out);
    let text = stdout(&out);
    assert!(
        text.contains("  Prompts: each level sends its own 4"),
        "{text}"
    );
    assert!(
        text.contains("  Server metrics: /metrics (specula names)"),
        "{text}"
    );
    let levels: Vec<&str> = text.lines().filter(|l| l.starts_with("  C=")).collect();
    assert_eq!(levels.len(), 2, "{text}");
    assert!(
        levels.iter().all(|l| l.ends_with(" req/s (100%)")),
        "{text}"
    );
    assert_eq!(
        text.matches("      server (specula): cache hit 0.0% (")
            .count(),
        2,
        "{text}"
    );
    // A metrics read at start; per level a flush, a read, its prompts, a read.
    let (shape, prompts) = mock_log(&mock);
    assert_eq!(shape, "mpFmppppmFmppppm");
    let unique: std::collections::HashSet<&String> = prompts.iter().collect();
    assert_eq!(unique.len(), 9, "no prompt sent twice");

    let run = load(&json);
    assert_eq!(run["config"]["flush_cache"], true);
    assert_eq!(run["config"]["goodput"]["ttft_ms"], 10000.0);
    for level in run["levels"].as_array().unwrap() {
        let stats = &level["stats"];
        assert_eq!(stats["repeated_prompts"], 0);
        assert_eq!(stats["goodput"]["good"], 4);
        assert_eq!(stats["server"]["server"], "specula");
        assert_eq!(stats["server"]["generation_tokens"], 20);
        assert_eq!(stats["server"]["cache_hit_rate"], 0.0);
    }
    let table = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split(',').collect()).collect();
    let column = |name: &str| rows[0].iter().position(|h| *h == name).unwrap();
    for row in &rows[1..] {
        assert_eq!(row[column("repeated_prompts")], "0", "{table}");
        assert_eq!(row[column("goodput_share")], "1.0000", "{table}");
        assert_eq!(row[column("server_generation_tokens")], "20", "{table}");
        assert_eq!(row[column("server_cache_hit_rate")], "0.0000", "{table}");
    }
}

#[test]
fn reused_prompts_are_served_from_the_cache_at_later_levels() {
    let again = Mock::start(&["--tokens-per-second", "4000", "--ttft-ms", "1", "--metrics"]);
    let out = bench(
        &again.url,
        &[
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "4",
            "--max-tokens",
            "5",
            "--warmup-requests",
            "1",
            "--reuse-prompts",
            "--verbose",
        ],
    );
    assert_success(&out);
    let text = stdout(&out);
    assert!(
        text.contains("Prompts: the same 4 at every level (--reuse-prompts)"),
        "{text}"
    );
    assert!(
        text.contains("      server (specula): cache hit 100.0% ("),
        "{text}"
    );
    assert!(
        text.contains("      4 of 4 prompts were sent earlier in the run"),
        "{text}"
    );
    let (_, prompts) = mock_log(&again);
    assert_eq!(prompts[1..5].len(), 4);
    let mut first: Vec<&String> = prompts[1..5].iter().collect();
    let mut second: Vec<&String> = prompts[5..9].iter().collect();
    first.sort();
    second.sort();
    assert_eq!(first, second);
}

#[test]
fn a_first_slice_continues_a_sweep_run_a_level_per_invocation() {
    // Generated sets too: their prompts must not depend on how many the sweep needs.
    for dataset in ["synthetic", "random:16"] {
        let run = |mock: &Mock, levels: &str, slice: &str| {
            let out = bench(
                &mock.url,
                &[
                    "--concurrency",
                    levels,
                    "--requests-per-level",
                    "3",
                    "--max-tokens",
                    "3",
                    "--warmup-requests",
                    "1",
                    "--dataset",
                    dataset,
                    "--first-slice",
                    slice,
                ],
            );
            assert_success(&out);
        };
        let split = Mock::start(&["--tokens-per-second", "4000", "--ttft-ms", "1"]);
        run(&split, "1", "0");
        run(&split, "1", "1");
        let whole = Mock::start(&["--tokens-per-second", "4000", "--ttft-ms", "1"]);
        run(&whole, "1,1", "0");
        // Each invocation warms up with the same prompt; the levels follow one another.
        let (_, split) = mock_log(&split);
        let (_, whole) = mock_log(&whole);
        assert_eq!(
            [&split[1..4], &split[5..8]].concat(),
            whole[1..7],
            "{dataset}"
        );
        assert_eq!(split[0], split[4], "{dataset}");
    }
}

#[test]
fn saved_runs_compare_plot_and_export() {
    // Paces slow enough that a busy machine's scheduling delays (a few ms a request) cannot
    // hide the factor of two: 205 against 105 ms a request.
    let slow = Mock::start(&["--tokens-per-second", "100", "--ttft-ms", "5"]);
    let fast = Mock::start(&["--tokens-per-second", "200", "--ttft-ms", "5"]);
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    for (mock, name) in [(&slow, "base"), (&fast, "cand")] {
        let out = bench(
            &mock.url,
            &[
                "--concurrency",
                "1,4",
                "--requests-per-level",
                "8",
                "--max-tokens",
                "20",
                "--warmup-requests",
                "1",
                "--output",
                &path(&format!("{name}.json")),
                "--csv",
                &path(&format!("{name}.csv")),
                "--plot",
                &path(&format!("{name}.svg")),
            ],
        );
        assert_success(&out);
    }
    let csv = std::fs::read_to_string(path("base.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    assert!(
        std::fs::read_to_string(path("base.svg"))
            .unwrap()
            .contains("Throughput vs concurrency")
    );

    let out = Command::new(BIN)
        .args(["bench", "compare", &path("base.json"), &path("cand.json")])
        .args(["--plot", &path("cmp.svg"), "--output", &path("cmp.json")])
        .output()
        .unwrap();
    assert_success(&out);
    let text = stdout(&out);
    let re = Regex::new(r"^  C=\s*(\d+) \| throughput:\s+[\d.]+ ->\s+[\d.]+ tok/s  x([\d.]+) \[([\d.]+), ([\d.]+)\] \| per-req x([\d.]+)").unwrap();
    let rows: Vec<regex::Captures> = text.lines().filter_map(|l| re.captures(l)).collect();
    assert_eq!(rows.len(), 2, "{text}");
    for row in &rows {
        let per_req: f64 = row[5].parse().unwrap();
        assert!(per_req > 1.5 && per_req < 2.3, "twice the pace: {text}");
        let (ratio, lo, hi): (f64, f64, f64) = (
            row[2].parse().unwrap(),
            row[3].parse().unwrap(),
            row[4].parse().unwrap(),
        );
        assert!(lo <= ratio && ratio <= hi && lo > 1.0, "{text}");
    }
    assert!(
        text.contains("Crossover: none; the candidate has the higher throughput at every level."),
        "{text}"
    );
    let svg = std::fs::read_to_string(path("cmp.svg")).unwrap();
    assert!(
        svg.contains(">\nbase\n<") || svg.contains(">base<"),
        "legend names the runs"
    );
    let cmp = load(Path::new(&path("cmp.json")));
    assert_eq!(cmp["crossover"], "AlwaysWins");
}

#[test]
fn compare_rejects_files_that_are_not_runs() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("x.json");
    std::fs::write(&bogus, "[1, 2]").unwrap();
    let out = Command::new(BIN)
        .args(["bench", "compare"])
        .args([&bogus, &bogus])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a specula bench result"));
}

#[test]
fn demo_runs_a_sweep_against_the_built_in_mock() {
    let out = Command::new(BIN)
        .args([
            "demo",
            "--mock",
            "--concurrency",
            "1,2",
            "--requests-per-level",
            "3",
            "--max-tokens",
            "5",
        ])
        .args(["--warmup-requests", "1"])
        .output()
        .unwrap();
    assert_success(&out);
    let re = Regex::new(LEVEL_LINE).unwrap();
    assert_eq!(stdout(&out).lines().filter(|l| re.is_match(l)).count(), 2);
}

#[test]
fn accept_lengths_show_on_level_lines_in_saved_runs_and_in_compare() {
    let plain = Mock::start(&["--tokens-per-second", "1000", "--ttft-ms", "1"]);
    let spec = Mock::start(&[
        "--tokens-per-second",
        "1000",
        "--ttft-ms",
        "1",
        "--spec-accept-length",
        "2.5",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let level_line = Regex::new(LEVEL_LINE.trim_end_matches('$')).unwrap();
    for (mock, name, accept) in [(&plain, "base", false), (&spec, "cand", true)] {
        let output = path(&format!("{name}.json"));
        let out = bench(
            &mock.url,
            &[
                "--concurrency",
                "1,2",
                "--requests-per-level",
                "3",
                "--max-tokens",
                "8",
                "--warmup-requests",
                "0",
                "--output",
                &output,
            ],
        );
        assert_success(&out);
        let text = stdout(&out);
        let lines: Vec<&str> = text.lines().filter(|l| level_line.is_match(l)).collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in lines {
            assert_eq!(line.ends_with("| ok: 3/3 | accept 2.50"), accept, "{line}");
        }
    }
    let run = load(Path::new(&path("cand.json")));
    assert_eq!(run["levels"][0]["stats"]["spec_accept_length"], 2.5);
    assert_eq!(requests(&run, 1)[2]["spec_accept_length"], 2.5);
    let out = Command::new(BIN)
        .args(["bench", "compare", &path("base.json"), &path("cand.json")])
        .output()
        .unwrap();
    assert_success(&out);
    let text = stdout(&out);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  C=")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows.iter().all(|l| l.ends_with("| accept n/a -> 2.50")),
        "{text}"
    );
}

#[test]
fn demo_compare_spec_refuses_the_mock_and_stray_spec_flags() {
    for args in [
        &["demo", "--mock", "--compare-spec"][..],
        &["demo", "--mock", "--spec-fixed"][..],
        &["demo", "--compare-spec", "--mock-ttft-ms", "1", "--mock"][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
    }
    let out = Command::new(BIN)
        .args(["demo", "--compare-spec", "--spec-algorithm", "NONE"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use NGRAM or STANDALONE"));
}

#[test]
fn demo_compare_spec_alternates_two_servers_and_compares_them() {
    let out = Command::new(BIN)
        .args(["demo", "--compare-spec", "--concurrency", "1,2"])
        .args(["--requests-per-level", "2", "--max-tokens", "16"])
        .args(["--warmup-requests", "1", "--threads", "2", "--model-path"])
        .arg(common::model_path())
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The levels ran alternately: baseline, candidate, baseline, candidate.
    let sides: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let (side, rest) = l.split_once(' ')?;
            let level = rest.trim_start().strip_prefix("C=")?.trim_start();
            Some((side, level.split(' ').next()?))
        })
        .collect();
    let names: Vec<String> = sides.iter().map(|(s, c)| format!("{s}@{c}")).collect();
    assert_eq!(
        names,
        [
            "baseline@1",
            "suffix-adaptive@1",
            "baseline@2",
            "suffix-adaptive@2"
        ],
        "{text}"
    );
    assert!(
        text.contains("candidate `suffix-adaptive` against baseline `baseline`"),
        "{text}"
    );
    let row = Regex::new(
        r"^  C=\s*(\d+) \| throughput:.* \| ok: 2/2 -> 2/2 \| accept n/a -> (\d+\.\d+)$",
    )
    .unwrap();
    let rows: Vec<regex::Captures> = text.lines().filter_map(|l| row.captures(l)).collect();
    assert_eq!(
        rows.len(),
        2,
        "both levels, the candidate's accept length: {text}"
    );
    assert_eq!((&rows[0][1], &rows[1][1]), ("1", "2"), "{text}");
    for r in &rows {
        let accept: f64 = r[2].parse().unwrap();
        assert!(accept >= 1.0, "tokens per verification pass: {text}");
    }
}
