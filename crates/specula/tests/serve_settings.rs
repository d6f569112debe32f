//! `specula serve`'s settings through the real binary, without a model: `--help` shows the
//! defaults, a flag wins over the config file and the file over a default, and a bad value
//! fails at once with one line naming its flag (or the file and key).

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_specula");

fn serve(args: &[&str]) -> Output {
    Command::new(BIN).arg("serve").args(args).output().unwrap()
}

/// The one `error:` line of a failed start, and the exit code.
fn failure(args: &[&str]) -> (String, i32) {
    let out = serve(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
    (errors[0].to_owned(), out.status.code().unwrap_or(-1))
}

#[test]
fn help_shows_every_default() {
    let out = serve(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    // Each flag's section, up to the next flag.
    let section = |flag: &str| {
        let start = help
            .find(&format!("  {flag} "))
            .or_else(|| help.find(&format!("  {flag}\n")))
            .unwrap_or_else(|| panic!("{flag} is not in --help:\n{help}"));
        let rest = &help[start + flag.len() + 2..];
        let end = rest.find("\n      --").unwrap_or(rest.len());
        // One line, however --help wrapped it.
        rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    for (flag, default) in [
        ("--host", "127.0.0.1"),
        ("--port", "30000"),
        ("--max-running-requests", "64"),
        ("--max-queued-requests", "256"),
        ("--max-total-tokens", "32768"),
        ("--chunked-prefill-size", "512"),
        ("--log-level", "info"),
        ("--shutdown-timeout", "30"),
        ("--speculative-algorithm", "NONE"),
        ("--speculative-num-steps", "4"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-ngram-min-match-window", "1"),
        ("--speculative-ngram-max-match-window", "12"),
        ("--schedule-policy", "fcfs"),
        ("--hicache-ratio", "2.0"),
        ("--activations", "int8"),
        ("--kv-cache-dtype", "f32"),
    ] {
        let text = section(flag);
        assert!(
            text.contains(&format!("[default: {default}]")),
            "{flag}: {text}"
        );
    }
    // The settings without a fixed default say what they default to.
    for flag in [
        "--model-path",
        "--served-model-name",
        "--context-length",
        "--threads",
        "--speculative-num-draft-tokens",
        "--speculative-disable-batch-threshold",
        "--tool-call-parser",
        "--reasoning-parser",
    ] {
        let text = section(flag);
        assert!(text.contains("[default: "), "{flag}: {text}");
    }
}

#[test]
fn a_flag_wins_over_the_file_and_the_file_over_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "max-running-requests = 0\n").unwrap();
    let config = config.to_str().unwrap();
    // The file's 0 replaces the default 64, and is refused before anything starts.
    let (e, code) = failure(&["--config", config, "--port", "0"]);
    assert!(
        e.contains("--max-running-requests must be at least 1"),
        "{e}"
    );
    assert_eq!(code, 2);
    // With the flag the settings are good: start-up goes on to bind the port (taken here, so
    // it stops there, before any model is loaded).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (e, _) = failure(&[
        "--config",
        config,
        "--max-running-requests",
        "2",
        "--port",
        &port,
        "--model-path",
        "/nonexistent/model.gguf",
    ]);
    assert!(e.contains("cannot listen"), "{e}");
}

#[test]
fn a_bad_value_fails_naming_its_flag() {
    let cases: [(&[&str], &str); 7] = [
        (&["--activations", "fp8"], "--activations"),
        (&["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype"),
        (
            &["--max-running-requests", "lots"],
            "--max-running-requests",
        ),
        (&["--schedule-policy", "lifo"], "--schedule-policy"),
        (
            &["--speculative-algorithm", "eagle9"],
            "--speculative-algorithm",
        ),
        (&["--chunked-prefill-size", "0"], "--chunked-prefill-size"),
        (
            &[
                "--speculative-algorithm",
                "ngram",
                "--speculative-ngram-min-match-window",
                "0",
            ],
            "--speculative-ngram-min-match-window",
        ),
    ];
    for (args, flag) in cases {
        let (e, code) = failure(args);
        assert!(e.contains(flag), "{args:?}: {e}");
        assert_eq!(code, 2, "{args:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "port = 0\nspeculative-algorithm = \"eagle9\"\n").unwrap();
    let (e, code) = failure(&["--config", config.to_str().unwrap()]);
    assert!(
        e.contains("bad.toml") && e.contains("speculative-algorithm") && e.contains("NGRAM"),
        "{e}"
    );
    assert_eq!(code, 2);
}
