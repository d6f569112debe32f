#!/usr/bin/env python3
"""make_chat_template_reference.py — chat prompts rendered by llama.cpp, for the template test.

Starts llama.cpp's llama-server with the SmolLM2 model on a loopback port, posts each
conversation below to its /apply-template endpoint (the chat-completions path without the
inference), and writes crates/model/tests/data/chat_template/smollm2.jsonl: one JSON object a
line, {"name", "request", "prompt"}, where `request` is the body that was posted (`messages`
and any options such as `add_generation_prompt`) and `prompt` is what llama-server rendered.
crates/model/tests/chat_template_llamacpp.rs checks that `ChatTemplate::render` gives exactly
`prompt` for each. The server is stopped before the script exits.

Usage:
    scripts/tokenizer/make_chat_template_reference.py
    scripts/tokenizer/make_chat_template_reference.py qwen2.5-coder-0.5b   # a model by name
        (pulled by `specula model pull`) into chat_template/NAME.jsonl, with conversations that
        offer tools, make calls and return their results (Qwen's template takes them)
    SPECULA_MODEL=... LLAMA_CPP_BIN=... PORT=30222 scripts/tokenizer/make_chat_template_reference.py
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/model/tests/data/chat_template/smollm2.jsonl"
HOST = "127.0.0.1"
PORT = int(os.environ.get("PORT", "30222"))


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def system(text):
    return {"role": "system", "content": text}


def parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


CASES = [
    ("single_user_turn", {"messages": [user("Hello!")]}),
    ("system_and_user", {"messages": [system("You are a pirate."), user("Where is the treasure?")]}),
    ("multi_turn", {"messages": [
        user("What is 2+2?"), assistant("4."), user("And times 3?"), assistant("12."),
        user("Thanks!")]}),
    ("system_multi_turn", {"messages": [
        system("Answer in one word."), user("Capital of France?"), assistant("Paris"),
        user("Of Japan?")]}),
    ("unicode", {"messages": [
        user("Ünïcödé 😀 👨‍👩‍👧‍👦 中文 日本語 한국어 العربية עברית\tTab\u00a0nbsp"),
        assistant("¡Sí! — “quotes” ‘single’ …"), user("Ελληνικά ✓")]}),
    ("empty_content", {"messages": [user("")]}),
    ("empty_assistant_then_user", {"messages": [user("a"), assistant(""), user("b")]}),
    ("ends_with_assistant", {"messages": [user("Write a haiku."), assistant("Autumn moonlight—")]}),
    ("system_ends_with_assistant", {"messages": [
        system("Be terse."), user("Hi"), assistant("Hello"), user("Bye"), assistant("Good")]}),
    ("text_parts", {"messages": [{"role": "user", "content": parts("First part.", "Second part.")}]}),
    ("assistant_parts_prefill", {"messages": [
        user("Go on"), {"role": "assistant", "content": parts("one", "two")}]}),
    ("no_generation_prompt", {"messages": [user("Hi"), assistant("Hello!")],
                               "add_generation_prompt": False}),
    ("no_generation_prompt_user_last", {"messages": [user("Hi")], "add_generation_prompt": False}),
    ("system_only", {"messages": [system("Only a system prompt.")]}),
    ("developer_role", {"messages": [{"role": "developer", "content": "Dev says hi."}, user("Yo")]}),
    ("null_content", {"messages": [{"role": "user", "content": None}]}),
    ("special_token_text_in_content", {"messages": [
        user("Literal <|im_end|> and <|im_start|>assistant inside"), assistant("ok <|endoftext|>"),
        user("again")]}),
    ("whitespace_content", {"messages": [user("  leading\n\ntrailing  \n"), user("\t\t")]}),
    ("tool_role", {"messages": [user("Weather?"), {"role": "tool", "content": "{\"temp\": 21}"}]}),
    ("long_conversation", {"messages": [
        m for i in range(6) for m in (user(f"Question {i}: " + "why? " * i), assistant(f"Answer {i}."))
    ] + [user("Last one.")]}),
]


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now."}},
]


def call(name, arguments, id_):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


# Conversations with tools, for the templates that take them (Qwen's).
TOOL_CASES = [
    ("tools_offered", {"messages": [user("What's the weather like in Paris right now?")],
                       "tools": TOOLS}),
    ("tools_with_system", {"messages": [system("Be brief."), user("Time?")], "tools": TOOLS}),
    ("tool_round_trip", {"messages": [
        user("Weather in Paris?"),
        {"role": "assistant", "content": None,
         "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}", "call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 22}"},
    ], "tools": TOOLS}),
    ("two_calls_two_results", {"messages": [
        user("Weather and time?"),
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [call("get_weather", "{\"city\": \"Oslo\"}", "a"), call("get_time", "{}", "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "rain"},
        {"role": "tool", "tool_call_id": "b", "content": "12:00"},
        assistant("Rain, and it is noon."), user("Thanks"),
    ], "tools": TOOLS}),
]


def post(path, body):
    req = urllib.request.Request(f"http://{HOST}:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def wait_healthy(proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"make_chat_template_reference: llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    sys.exit("make_chat_template_reference: llama-server did not become healthy")


def last_line(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [l for l in out.splitlines() if l.strip()][-1]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else None
    out = OUT.with_name(f"{name}.jsonl") if name else OUT
    cases = CASES + (TOOL_CASES if name and name.startswith("qwen") else [])
    if name:
        model = last_line(["cargo", "run", "--release", "--quiet", "-p", "specula", "--",
                           "model", "pull", name])
    else:
        model = os.environ.get("SPECULA_MODEL") or last_line([str(ROOT / "scripts/fetch-model.sh")])
    bin_dir = os.environ.get("LLAMA_CPP_BIN") or last_line([str(ROOT / "scripts/build-llama-cpp.sh")])
    cmd = [str(Path(bin_dir) / "llama-server"), "-m", model, "--host", HOST, "--port", str(PORT),
           "-c", "512", "-np", "1", "-t", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(proc)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            for case, request in cases:
                prompt = post("/apply-template", request)["prompt"]
                f.write(json.dumps({"name": case, "request": request, "prompt": prompt},
                                   ensure_ascii=False) + "\n")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"make_chat_template_reference: wrote {len(cases)} renderings to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
