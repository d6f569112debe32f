//! The listener against raw TCP clients on loopback: timeouts, eviction, refusal, streaming and
//! shutdown, with short limits and generous bounds.

use super::*;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The most any one wait in these tests lasts.
const BOUND: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Hits {
    slow_started: AtomicUsize,
    /// Bodies of `/endless` dropped (the request's work ended).
    endless_dropped: AtomicUsize,
}

struct TestServer {
    addr: std::net::SocketAddr,
    stats: Arc<ConnectionStats>,
    hits: Arc<Hits>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

fn limits(header_ms: u64, body_ms: u64, keep_alive_ms: u64, max: usize) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_millis(header_ms),
        body_read_timeout: Duration::from_millis(body_ms),
        keep_alive_timeout: Duration::from_millis(keep_alive_ms),
        send_timeout: Duration::from_millis(300),
        max_connections: max,
    }
}

#[derive(serde::Deserialize)]
struct SlowQuery {
    ms: u64,
}

fn app(hits: Arc<Hits>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/slow",
            get(
                |State(h): State<Arc<Hits>>, Query(q): Query<SlowQuery>| async move {
                    h.slow_started.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(q.ms)).await;
                    "slow done"
                },
            ),
        )
        .route(
            "/echo",
            post(|body: Result<Bytes, BytesRejection>| async move {
                match body {
                    Ok(b) => (StatusCode::OK, b.len().to_string()),
                    Err(e) if body_timeout(&e).is_some() => {
                        (StatusCode::REQUEST_TIMEOUT, e.to_string())
                    }
                    Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
                }
            }),
        )
        .route("/stream", get(stream))
        .route("/endless", get(endless))
        .with_state(hits)
}

/// 20 chunks, 50 ms apart: a second in all, longer than every timeout in these tests.
async fn stream() -> Body {
    let chunks = futures_util::stream::unfold(0u32, |i| async move {
        if i == 20 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Some((Ok::<_, Infallible>(format!("chunk-{i:02};")), i + 1))
    });
    Body::from_stream(chunks)
}

/// Counts, when dropped, a body that has ended.
struct DropCount(Arc<Hits>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.endless_dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// 64 KiB chunks for ever, as fast as the client takes them.
async fn endless(State(h): State<Arc<Hits>>) -> Body {
    let chunks = futures_util::stream::unfold(DropCount(h), |d| async move {
        Some((Ok::<_, Infallible>(vec![b'x'; 64 << 10]), d))
    });
    Body::from_stream(chunks)
}

async fn start(limits: ConnectionLimits) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(ConnectionStats::default());
    let hits = Arc::new(Hits::default());
    let (stop, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        listener,
        app(hits.clone()),
        limits,
        stats.clone(),
        async {
            let _ = stop_rx.await;
        },
    ));
    TestServer {
        addr,
        stats,
        hits,
        stop: Some(stop),
        task,
    }
}

impl TestServer {
    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// Waits (bounded) until `check` holds of the counters.
    async fn wait_for(&self, what: &str, check: impl Fn(&StatsSnapshot) -> bool) {
        let t0 = Instant::now();
        while !check(&self.stats.snapshot()) {
            assert!(
                t0.elapsed() < BOUND,
                "{what}: never happened: {:?}",
                self.stats.snapshot()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn wait_slow_started(&self, n: usize) {
        let t0 = Instant::now();
        while self.hits.slow_started.load(Ordering::SeqCst) < n {
            assert!(t0.elapsed() < BOUND, "the slow requests never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn get_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n")
}

/// One response read off `s`: by its content-length, to its last chunk, or to the end.
async fn read_reply(s: &mut TcpStream) -> Reply {
    tokio::time::timeout(BOUND, read_reply_unbounded(s))
        .await
        .expect("no response in time")
        .expect("cannot read the response")
}

async fn read_reply_unbounded(s: &mut TcpStream) -> io::Result<Reply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut reply = Reply {
        status,
        head,
        body: buf[head_end..].to_vec(),
    };
    let length = reply.header("content-length").and_then(|v| v.parse().ok());
    let chunked = reply.header("transfer-encoding") == Some("chunked");
    loop {
        let done = match length {
            Some(n) => reply.body.len() >= n,
            None if chunked => reply.body.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if done {
            return Ok(reply);
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return if length.is_none() && !chunked {
                Ok(reply)
            } else {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "body cut"))
            };
        }
        reply.body.extend_from_slice(&chunk[..n]);
    }
}

/// Waits until the server closes `s` (end of stream or a reset); how long that took, and
/// what came before. Panics if it stays open past the bound.
async fn wait_closed(s: &mut TcpStream) -> (Duration, Vec<u8>) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let left = BOUND.saturating_sub(t0.elapsed());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Err(_) => panic!("the connection stayed open for {BOUND:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return (t0.elapsed(), got),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

#[tokio::test]
async fn half_a_header_is_closed_after_the_header_timeout() {
    let server = start(limits(300, 5000, 5000, 64)).await;
    let mut s = server.connect().await;
    s.write_all(b"GET /health HTTP/1.1\r\nhost: test\r\n")
        .await
        .unwrap();
    let (took, got) = wait_closed(&mut s).await;
    assert!(took >= Duration::from_millis(200), "closed early: {took:?}");
    assert!(took < Duration::from_secs(3), "closed late: {took:?}");
    // hyper closes without a response (no 408).
    assert!(
        got.is_empty(),
        "answered: {:?}",
        String::from_utf8_lossy(&got)
    );
    server
        .wait_for("a header timeout", |s| s.header_timeouts_total == 1)
        .await;
    // A client that sends its headers in time is served.
    let mut s = server.connect().await;
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
}

#[tokio::test]
async fn a_silent_keep_alive_connection_is_closed_after_its_timeout() {
    // The header timeout is long: only the keep-alive timeout can close it in time.
    let server = start(limits(5000, 5000, 300, 64)).await;
    let mut s = server.connect().await;
    for _ in 0..2 {
        s.write_all(get_request("/health").as_bytes())
            .await
            .unwrap();
        let reply = read_reply(&mut s).await;
        assert_eq!((reply.status, reply.text().as_str()), (200, "ok"));
    }
    let (took, _) = wait_closed(&mut s).await;
    assert!(took >= Duration::from_millis(200), "closed early: {took:?}");
    assert!(took < Duration::from_secs(3), "closed late: {took:?}");
    server
        .wait_for("a keep-alive timeout", |s| {
            s.keep_alive_timeouts_total == 1 && s.open == 0
        })
        .await;
    assert_eq!(server.stats.snapshot().header_timeouts_total, 0);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_send_timeout() {
    let server = start(limits(5000, 5000, 5000, 64)).await;
    let mut s = server.connect().await;
    s.write_all(get_request("/endless").as_bytes())
        .await
        .unwrap();
    // Nothing is read: the socket's buffers fill, the server's write waits, then gives up.
    server
        .wait_for("a send timeout", |s| {
            s.send_timeouts_total == 1 && s.open == 0
        })
        .await;
    let t0 = Instant::now();
    while server.hits.endless_dropped.load(Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < BOUND,
            "the response's body was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A client that reads is not cut, however long the stream (each write goes on).
    let mut s = server.connect().await;
    s.write_all(get_request("/stream").as_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut s).await;
    assert_eq!(reply.status, 200);
    assert!(reply.text().contains("chunk-19;"), "{}", reply.text());
    assert_eq!(server.stats.snapshot().send_timeouts_total, 1);
}

/// What hyper does: its header read timeout starts again when a response ends, so it also
/// bounds the wait for the next request on a kept-alive connection.
#[tokio::test]
async fn hypers_header_timeout_also_bounds_the_wait_between_requests() {
    let server = start(limits(300, 5000, 10_000, 64)).await;
    let mut s = server.connect().await;
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
    let (took, _) = wait_closed(&mut s).await;
    assert!(took >= Duration::from_millis(200), "closed early: {took:?}");
    assert!(took < Duration::from_secs(3), "closed late: {took:?}");
    server
        .wait_for("a header timeout", |s| s.header_timeouts_total == 1)
        .await;
    assert_eq!(server.stats.snapshot().keep_alive_timeouts_total, 0);
}

#[tokio::test]
async fn a_next_request_begun_in_time_is_not_cut_by_the_keep_alive_timeout() {
    let server = start(limits(3000, 5000, 300, 64)).await;
    let mut s = server.connect().await;
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    // Past the keep-alive timeout, within the header timeout.
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.write_all(b"host: test\r\n\r\n").await.unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
    assert_eq!(server.stats.snapshot().keep_alive_timeouts_total, 0);
}

#[tokio::test]
async fn a_stalled_body_fails_within_the_body_timeout() {
    let server = start(limits(5000, 300, 5000, 64)).await;
    let post = "POST /echo HTTP/1.1\r\nhost: test\r\ncontent-length: 100\r\n\r\n";
    // A whole body arrives.
    let mut s = server.connect().await;
    s.write_all(format!("{post}{}", "x".repeat(100)).as_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut s).await;
    assert_eq!((reply.status, reply.text().as_str()), (200, "100"));
    // A tenth of one, then nothing.
    let mut s = server.connect().await;
    s.write_all(format!("{post}{}", "x".repeat(10)).as_bytes())
        .await
        .unwrap();
    let t0 = Instant::now();
    let reply = read_reply(&mut s).await;
    let took = t0.elapsed();
    assert_eq!(reply.status, 408, "{reply:?}");
    assert!(took >= Duration::from_millis(200), "failed early: {took:?}");
    assert!(took < Duration::from_secs(3), "failed late: {took:?}");
    assert_eq!(server.stats.snapshot().body_timeouts_total, 1);
    // The rest of the body never came: the connection is not reused.
    let (took, _) = wait_closed(&mut s).await;
    assert!(took < Duration::from_secs(1), "closed late: {took:?}");
}

#[tokio::test]
async fn at_the_cap_a_new_connection_evicts_the_oldest_idle_one() {
    let server = start(limits(10_000, 10_000, 10_000, 8)).await;
    let mut slow = server.connect().await;
    slow.write_all(get_request("/slow?ms=1500").as_bytes())
        .await
        .unwrap();
    server.wait_slow_started(1).await;
    let mut idle = Vec::new();
    for _ in 0..7 {
        idle.push(server.connect().await);
        // One at a time, so that the first is the oldest.
        let n = idle.len() as u64 + 1;
        server
            .wait_for("the idle connections", |s| s.open == n)
            .await;
    }
    let mut fresh = Vec::new();
    for i in 0..10u64 {
        let mut s = server.connect().await;
        s.write_all(get_request("/health").as_bytes())
            .await
            .unwrap();
        let reply = read_reply(&mut s).await;
        assert_eq!((reply.status, reply.text().as_str()), (200, "ok"), "#{i}");
        fresh.push(s);
        assert_eq!(server.stats.snapshot().evicted_total, i + 1);
        assert_eq!(server.stats.snapshot().open, 8);
    }
    // The first idle connection went first; the slow request was never evicted.
    wait_closed(&mut idle[0]).await;
    let reply = read_reply(&mut slow).await;
    assert_eq!((reply.status, reply.text().as_str()), (200, "slow done"));
    assert_eq!(server.stats.snapshot().refused_total, 0);
}

#[tokio::test]
async fn with_every_connection_busy_a_new_one_gets_a_503() {
    let server = start(limits(10_000, 10_000, 10_000, 2)).await;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = server.connect().await;
        s.write_all(get_request("/slow?ms=1000").as_bytes())
            .await
            .unwrap();
        busy.push(s);
    }
    server.wait_slow_started(2).await;
    let mut s = server.connect().await;
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut s).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"));
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": {
            "message": "too many open connections (2)",
            "type": "service_unavailable",
            "param": null,
            "code": 503,
        }})
    );
    wait_closed(&mut s).await;
    assert_eq!(server.stats.snapshot().refused_total, 1);
    for mut s in busy {
        assert_eq!(read_reply(&mut s).await.status, 200);
    }
}

#[tokio::test]
async fn a_streamed_response_outlasts_every_timeout_and_is_never_evicted() {
    // One connection at most: while the stream runs, a newcomer finds it busy.
    let server = start(limits(200, 200, 200, 1)).await;
    let mut s = server.connect().await;
    s.write_all(get_request("/stream").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 64];
    let n = tokio::time::timeout(BOUND, s.read(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert!(n > 0);
    let mut other = server.connect().await;
    other
        .write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut other).await.status, 503);
    // The rest of the stream, chunked, all of it.
    let rest = read_reply_unbounded_after(&mut s, &first[..n]).await;
    let text = String::from_utf8_lossy(&rest);
    let mut at = 0;
    for i in 0..20 {
        let chunk = format!("chunk-{i:02};");
        let found = text[at..]
            .find(&chunk)
            .unwrap_or_else(|| panic!("no {chunk}"));
        at += found + chunk.len();
    }
    assert!(text.ends_with("0\r\n\r\n"), "{text}");
    // Kept alive after it.
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut s).await.status, 200);
}

/// What follows `start` on `s` up to the last chunk of a chunked response.
async fn read_reply_unbounded_after(s: &mut TcpStream, start: &[u8]) -> Vec<u8> {
    let mut got = start.to_vec();
    let mut chunk = [0u8; 4096];
    let t0 = Instant::now();
    while !got.ends_with(b"\r\n0\r\n\r\n") {
        let left = BOUND.saturating_sub(t0.elapsed());
        let n = tokio::time::timeout(left, s.read(&mut chunk))
            .await
            .expect("the stream stalled")
            .unwrap();
        assert!(
            n > 0,
            "the stream was cut: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

#[tokio::test]
async fn shutdown_closes_idle_connections_and_waits_for_the_request_in_progress() {
    let mut server = start(limits(10_000, 10_000, 10_000, 64)).await;
    let mut between = server.connect().await;
    between
        .write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_reply(&mut between).await.status, 200);
    let mut fresh = server.connect().await;
    // Part of a request's headers: idle too (hyper alone would wait for the rest).
    let mut partial = server.connect().await;
    partial
        .write_all(b"GET /health HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut slow = server.connect().await;
    slow.write_all(get_request("/slow?ms=800").as_bytes())
        .await
        .unwrap();
    server.wait_slow_started(1).await;
    server.wait_for("four connections", |s| s.open == 4).await;
    let t0 = Instant::now();
    let _ = server.stop.take().unwrap().send(());
    for s in [&mut between, &mut fresh, &mut partial] {
        let (took, got) = wait_closed(s).await;
        assert!(took < Duration::from_secs(2), "closed late: {took:?}");
        assert!(got.is_empty(), "{got:?}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!server.task.is_finished(), "stopped with a request running");
    let reply = read_reply(&mut slow).await;
    assert_eq!((reply.status, reply.text().as_str()), (200, "slow done"));
    assert!(t0.elapsed() >= Duration::from_millis(500));
    tokio::time::timeout(BOUND, &mut server.task)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
    assert_eq!(server.stats.snapshot().open, 0);
    // No longer accepting.
    if let Ok(mut s) = TcpStream::connect(server.addr).await {
        let _ = s.write_all(get_request("/health").as_bytes()).await;
        assert!(read_reply_unbounded(&mut s).await.is_err());
    }
}

#[test]
fn the_descriptor_limit_is_raised_to_the_hard_limit() {
    let (before, after) = raise_fd_limit();
    let (soft, hard) = nofile_limit().expect("RLIMIT_NOFILE");
    assert_eq!(soft, after);
    assert!(after >= before);
    if cfg!(target_os = "linux") {
        assert_eq!(soft, hard);
    }
    let cap = default_max_connections();
    assert!((1..=MAX_CONNECTIONS_CAP).contains(&cap));
    assert!(
        (cap as u64) < soft.max(2),
        "{cap} connections with {soft} descriptors"
    );
    assert_eq!(ConnectionLimits::default().max_connections, cap);
}

#[tokio::test]
async fn health_answers_under_a_flood_of_idle_connections() {
    let server = start(limits(10_000, 10_000, 10_000, 16)).await;
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(server.connect().await);
    }
    server
        .wait_for("the flood accepted", |s| s.accepted_total == 200)
        .await;
    let mut s = server.connect().await;
    s.write_all(get_request("/health").as_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut s).await;
    assert_eq!((reply.status, reply.text().as_str()), (200, "ok"));
    let stats = server.stats.snapshot();
    assert_eq!((stats.open, stats.refused_total), (16, 0));
    assert_eq!(stats.evicted_total, 201 - 16);
}
