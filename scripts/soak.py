#!/usr/bin/env python3
"""A soak of a running `specula serve`: C clients send a mix of requests for a while (streamed
and whole chat, completions, streams the client drops after a few events, structured outputs,
forced tool calls, and now and then a hostile one that must be a 4xx), the server's RSS is
sampled every 10 s from /proc, and the run fails on any 5xx, any request with no answer, or RSS
after the warm-up growing by more than 10 %.

Usage: soak.py --url http://127.0.0.1:PORT --pid PID [--seconds 1800] [--concurrency 32]
Standard library only; prints one line per RSS sample and a summary (also as JSON with --json).
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child.",
    "List three prime numbers.",
    "Describe a person called Ana who is 31.",
    "What is the weather in Paris?",
]


def chat(question, **extra):
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 48}
    body.update(extra)
    return "/v1/chat/completions", body


def request_of(kind, rng):
    q = rng.choice(QUESTIONS)
    if kind == "chat":
        return chat(q, temperature=rng.choice([0, 0.7, 1.0]))
    if kind == "stream":
        return chat(q, stream=True, stream_options={"include_usage": True})
    if kind == "completion":
        return "/v1/completions", {"prompt": q, "max_tokens": 32, "n": rng.choice([1, 2])}
    if kind == "disconnect":
        return chat(q, stream=True, max_tokens=200)
    if kind == "schema":
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        return chat(q, response_format=fmt, stream=rng.random() < 0.5)
    if kind == "tools":
        return chat(q, tools=[TOOL], tool_choice="required")
    if kind == "hostile":
        return hostile(rng)
    raise ValueError(kind)


def hostile(rng):
    """A request that must be refused with a 4xx (never a 5xx)."""
    choice = rng.randrange(4)
    if choice == 0:
        rules = "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(1200))
        return chat("hi", ebnf="root ::= r0\n" + rules + 'r1200 ::= "a"\n')
    if choice == 1:
        props = {f"p{i}": {"type": "integer"} for i in range(3000)}
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": props}}}
        return chat("hi", response_format=fmt)
    if choice == 2:
        return chat("word " * 200_000)
    return chat("hi", no_such_field=True)


KINDS = ["chat"] * 4 + ["stream"] * 4 + ["completion"] * 2 + ["disconnect"] * 2 + [
    "schema"] * 2 + ["tools"] + ["hostile"]


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = {}
        self.errors = []

    def add(self, kind, status):
        with self.lock:
            key = f"{kind} {status}"
            self.by_kind[key] = self.by_kind.get(key, 0) + 1

    def error(self, message):
        with self.lock:
            self.errors.append(message)


def send(url, kind, rng, totals):
    path, body = request_of(kind, rng)
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    try:
        data = json.dumps(body).encode()
        conn.request("POST", path, data, {"content-type": "application/json"})
        r = conn.getresponse()
        if kind == "disconnect" and r.status == 200:
            # Read a few events, then go away mid-stream.
            for _ in range(rng.randrange(1, 6)):
                r.readline()
            conn.close()
            totals.add(kind, r.status)
            return
        payload = r.read()
        totals.add(kind, r.status)
        if r.status >= 500:
            totals.error(f"{kind}: {r.status} {payload[:200]!r}")
        elif kind == "hostile" and not 400 <= r.status < 500:
            totals.error(f"hostile: {r.status}")
        elif kind not in ("hostile",) and r.status != 200 and r.status != 503:
            totals.error(f"{kind}: {r.status} {payload[:200]!r}")
        elif body.get("stream") and r.status == 200 and b"data: [DONE]" not in payload:
            totals.error(f"{kind}: stream without [DONE]")
    except Exception as e:  # a request without an answer
        totals.error(f"{kind}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def client(url, deadline, seed, totals):
    rng = random.Random(seed)
    while time.time() < deadline:
        send(url, rng.choice(KINDS), rng, totals)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the RSS baseline (default: a tenth of the run)")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    warmup = a.warmup if a.warmup is not None else a.seconds / 10
    totals = Totals()
    start = time.time()
    deadline = start + a.seconds
    threads = [threading.Thread(target=client, args=(a.url, deadline, i, totals), daemon=True)
               for i in range(a.concurrency)]
    for t in threads:
        t.start()
    samples = []
    while time.time() < deadline:
        time.sleep(min(10, max(0, deadline - time.time())))
        t, m = time.time() - start, rss(a.pid)
        samples.append((t, m))
        print(f"{t:7.0f} s  RSS {m / 2**20:7.1f} MiB  errors {len(totals.errors)}", flush=True)
    for t in threads:
        t.join(timeout=330)
    after = [m for t, m in samples if t >= warmup] or [m for _, m in samples]
    base, top, last = after[0], max(after), after[-1]
    growth = (top - base) / base
    requests = sum(totals.by_kind.values())
    summary = {
        "seconds": a.seconds,
        "concurrency": a.concurrency,
        "requests": requests,
        "by_kind_and_status": dict(sorted(totals.by_kind.items())),
        "errors": totals.errors[:20],
        "error_count": len(totals.errors),
        "rss_start_mib": samples[0][1] / 2**20 if samples else 0,
        "rss_after_warmup_mib": base / 2**20,
        "rss_max_after_warmup_mib": top / 2**20,
        "rss_last_mib": last / 2**20,
        "rss_growth_after_warmup": growth,
    }
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "rss_samples": samples}, f, indent=1)
    ok = not totals.errors and growth <= 0.10
    print("soak:", "PASSED" if ok else "FAILED", f"({requests} requests, "
          f"{len(totals.errors)} errors, RSS growth {growth:+.1%} after warm-up)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
