"""Anthropic's Messages API through the official `anthropic` Python client against `specula serve`.

Usage: python3 scripts/anthropic_messages_test.py REAL_URL SCRIPTED_URL
(base URLs without /v1: the default model with --tool-call-parser hermes --reasoning-parser qwen3,
and the same with --scripted-output crates/specula/tests/fixtures/tool_script.json).
On the real model: `messages.create` and `messages.stream` give the same greedy text, stop
reason and usage; `stop_sequences` ends the text before the sequence and says which;
`max_tokens` ends it with `max_tokens`; `count_tokens` counts the prompt the answer's usage
reports; bad requests are the SDK's typed errors with Anthropic's error body. On the scripted
server: thinking, text and two tool_use blocks, streamed and not, and the round trip with
tool_result blocks. Exits non-zero on the first failed check. scripts/test-openai.sh runs it.
"""

import json
import sys
import urllib.request

import anthropic

real_url, scripted_url = sys.argv[1:3]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"anthropic messages check failed: {what}")
    checks += 1


def served_model(url):
    with urllib.request.urlopen(f"{url}/v1/models") as r:
        return json.load(r)["data"][0]["id"]


client = anthropic.Anthropic(base_url=real_url, api_key="unused", max_retries=0)
model = served_model(real_url)
system = "You are a helpful assistant. Answer in one sentence."
messages = [{"role": "user", "content": "What is the capital of France?"}]
# The SDK (2.x) no longer sends sampling fields; the server still takes them (older clients do).
greedy = {"temperature": 0}
base = dict(model=model, system=system, messages=messages, max_tokens=40, extra_body=greedy)

r = client.messages.create(**base)
check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), f"shape {r}")
check([b.type for b in r.content] == ["text"] and r.content[0].text, f"content {r.content}")
check(r.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {r.stop_reason}")
check(r.usage.output_tokens > 0 and r.usage.input_tokens + r.usage.cache_read_input_tokens > 5,
      f"usage {r.usage}")
text = r.content[0].text

# Streamed: the same text, stop reason and output tokens from Anthropic's events.
with client.messages.stream(**base) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed == text, f"streamed {streamed!r} != {text!r}")
check(final.stop_reason == r.stop_reason and final.usage.output_tokens == r.usage.output_tokens,
      f"streamed final {final}")
check([b.type for b in final.content] == ["text"] and final.content[0].text == text, "final text")

# A stop sequence from the middle of the answer ends it just before, and is named.
words = text.split()
check(len(words) >= 3, f"answer too short to cut: {text!r}")
cut = " " + words[2]
for stream in (False, True):
    kwargs = dict(base, stop_sequences=["NEVER-SEEN", cut])
    if stream:
        with client.messages.stream(**kwargs) as s:
            stopped = s.get_final_message()
    else:
        stopped = client.messages.create(**kwargs)
    check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == cut,
          f"stop {stopped.stop_reason} {stopped.stop_sequence!r}")
    check(stopped.content[0].text == text[:text.index(cut)], f"cut text {stopped.content}")

short = client.messages.create(**dict(base, max_tokens=3))
check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, f"short {short}")

# count_tokens counts the prompt the answer was given: its uncached and cached tokens together.
count = client.messages.count_tokens(model=model, system=system, messages=messages)
check(count.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens,
      f"count {count.input_tokens} vs usage {r.usage}")

# Bad requests: typed errors, Anthropic's body.
for bad, what in (
    (dict(base, model="claude-opus-4"), "model"),
    (dict(base, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]),
     "image"),
    (dict(base, extra_body={"temperature": 3.5}), "temperature"),
    (dict(base, speed="fast"), "speed"),
):
    try:
        client.messages.create(**bad)
        check(False, f"{what}: accepted")
    except anthropic.BadRequestError as e:
        check(e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error",
              f"{what}: body {e.body}")
        check(what in e.body["error"]["message"], f"{what}: message {e.body}")

# Structured outputs (`output_config.format`): the answer is JSON under the schema, closed.
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "country": {"type": "string", "maxLength": 20}},
          "required": ["city", "country"]}
for stream in (False, True):
    kwargs = dict(base, max_tokens=60, output_config={"format": {"type": "json_schema",
                                                                "schema": schema}},
                  messages=[{"role": "user", "content": "Where is Paris? Answer as JSON."}])
    if stream:
        with client.messages.stream(**kwargs) as s:
            got = s.get_final_message()
    else:
        got = client.messages.create(**kwargs)
    answer = json.loads(got.content[0].text)
    check(set(answer) == {"city", "country"}, f"structured answer {answer}")

# An assistant turn at the end is continued (Anthropic's prefill).
prefill = "The capital of France is"
r2 = client.messages.create(**dict(base, messages=messages + [
    {"role": "assistant", "content": prefill}]))
check(r2.content[0].text and not r2.content[0].text.startswith(prefill), f"prefill {r2.content}")

# The scripted server: thinking, text and two calls, then the round trip.
client = anthropic.Anthropic(base_url=scripted_url, api_key="unused", max_retries=0)
model = served_model(scripted_url)
tools = [
    {"name": "get_weather", "description": "The weather in a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}},
    {"name": "get_time", "description": "The time now.",
     "input_schema": {"type": "object", "properties": {}}},
]
turns = [{"role": "user", "content": "What is the weather in Zürich?"}]
kwargs = dict(model=model, messages=turns, tools=tools, max_tokens=200)
r = client.messages.create(**kwargs)
kinds = [b.type for b in r.content]
check(kinds == ["thinking", "text", "tool_use", "tool_use"], f"blocks {kinds}")
check(r.content[0].thinking == 'Maybe <tool_call>{"name": "draft"}</tool_call> first.',
      f"thinking {r.content[0]}")
check(r.content[1].text == "Let me check.", f"text {r.content[1]}")
calls = r.content[2:]
check([(c.name, c.input) for c in calls] == [("get_weather", {"city": "Zürich"}),
                                             ("get_time", {})], f"calls {calls}")
check(len({c.id for c in calls}) == 2, "distinct tool_use ids")
check(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason}")
with client.messages.stream(**kwargs) as s:
    final = s.get_final_message()
check([b.type for b in final.content] == kinds and final.stop_reason == "tool_use",
      f"streamed {final}")
check([(c.name, c.input) for c in final.content[2:]] == [(c.name, c.input) for c in calls],
      f"streamed calls {final.content}")
check(final.content[0].thinking == r.content[0].thinking, "streamed thinking")

results = {"get_weather": json.dumps({"temperature_c": 22, "sky": "sunny"}),
           "get_time": "12:00"}
turns = turns + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id,
                                  "content": results[c.name]} for c in calls]},
]
answer = client.messages.create(**dict(kwargs, messages=turns))
check([b.type for b in answer.content] == ["text"]
      and answer.content[0].text == "It is 22 °C and sunny in Zürich.", f"answer {answer}")
check(answer.stop_reason == "end_turn", f"answer stop {answer.stop_reason}")

print(f"anthropic messages: {checks} checks passed")
