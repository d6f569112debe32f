#!/usr/bin/env python3
"""Greedy generation, specula against llama.cpp: 20 prompts x 64 tokens, the length of the common
prefix of the two token sequences for each prompt. Informational: near-ties legitimately flip the
argmax between implementations (specula is the closer of the two to the exact float64 model, see
README.md in this folder), and after the first flip the continuations differ.

Both run the raw prompt (no chat template; a BOS where the model's add_bos flag asks for one) with
ignore_eos. llama.cpp runs as llama-server on a loopback port and is stopped at the end.

Usage: python3 scripts/reference/greedy_agreement.py [MODEL_NAME] [PORT]   (standard library only)
  MODEL_NAME  a model `specula model pull` knows (default: the default model's Q4_1 file)
"""
import json
import pathlib
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARGS = sys.argv[1:]
NAME = ARGS.pop(0) if ARGS and not ARGS[0].isdigit() else None
PORT = int(ARGS[0]) if ARGS else 30333
N = 64
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "Here is a recipe for pancakes:",
    "In 1969, the first humans",
    "The best way to learn a new language is",
    "Photosynthesis is the process by which",
    "Dear hiring manager,",
    "The main differences between TCP and UDP are",
    "A haiku about autumn:",
    "To install Python on Linux, first",
    "The quick brown fox",
    "List of the planets in the solar system:",
    "Water boils at",
    "The French Revolution began in",
    "import numpy as np\n",
    "Q: What is 12 times 12?\nA:",
    "The most important quality of a good leader is",
    "Machine learning is",
]


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    bin_dir = run([str(ROOT / "scripts/build-llama-cpp.sh")]).strip().splitlines()[-1]
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    if NAME:
        model = run([str(ROOT / "target/release/specula"), "model", "pull", NAME]).strip().splitlines()[-1]
    else:
        model = run([str(ROOT / "scripts/fetch-model.sh")]).strip().splitlines()[-1]
    server = subprocess.Popen(
        [f"{bin_dir}/llama-server", "-m", model, "--host", "127.0.0.1", "--port", str(PORT), "-np", "1", "-t", "2", "-c", "2048"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.5)
        rows = []
        for prompt in PROMPTS:
            body = json.dumps({"prompt": prompt, "n_predict": N, "temperature": 0, "top_k": 1, "ignore_eos": True,
                               "return_tokens": True, "cache_prompt": False}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{PORT}/completion", body, {"Content-Type": "application/json"})
            theirs = json.load(urllib.request.urlopen(req, timeout=120))["tokens"]
            out = run([str(ROOT / "target/release/specula"), "generate", "--model", model, "--prompt", prompt,
                       "--max-tokens", str(N), "--ignore-eos", "--show-ids"])
            ours = [int(t) for t in out.strip().splitlines()[-1].removeprefix("ids:").split()]
            agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            rows.append((prompt, agree))
            print(f"{agree:3d}/{N}  {prompt!r}", flush=True)
        full = sum(1 for _, a in rows if a == N)
        print(f"identical for all {N} tokens: {full} of {len(rows)} prompts; "
              f"mean agreement {sum(a for _, a in rows) / len(rows):.1f} tokens")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
