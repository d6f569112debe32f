"""Tool calling and reasoning output through the official `openai` Python client.

Usage: python3 scripts/openai_tools_test.py SCRIPTED_URL REAL_URL [QWEN_URL]
  SCRIPTED_URL  a `specula serve --tool-call-parser hermes --reasoning-parser qwen3
                --scripted-output crates/specula/tests/fixtures/tool_script.json` (base URL, /v1)
  REAL_URL      the same parsers on the real model, unscripted
  QWEN_URL      `specula serve --model qwen2.5-coder-0.5b --tool-call-parser qwen25`: the round
                trip on a model that makes calls (it writes them as bare JSON objects, or in a
                ```json fence)
The scripted server makes the round trip deterministic (request with tools -> tool calls ->
tool results in the history -> final answer), streamed and not; the real model shows that the
same requests come back well formed. Exits non-zero on the first failed check.
scripts/test-openai.sh runs it.
"""

import json
import sys

import openai

checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"openai tools check failed: {what}")
    checks += 1


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now."}},
]


def run_tool(call):
    if call.function.name == "get_weather":
        return json.dumps({"temperature_c": 22, "sky": "sunny"})
    return json.dumps({"time": "12:00"})


def streamed(client, model, messages, **kwargs):
    """Content, reasoning, calls ({index: [id, name, arguments]}) and finish of a stream, put
    together the way applications do."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, stream=True, **kwargs
    ):
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, [None, "", ""])
                if tc.id:
                    check(entry[0] is None, f"a second id for call {tc.index}")
                    entry[0] = tc.id
                if tc.function and tc.function.name:
                    entry[1] += tc.function.name
                if tc.function and tc.function.arguments:
                    entry[2] += tc.function.arguments
            finish = c.finish_reason or finish
    return content, reasoning, calls, finish


def scripted(url):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Zürich?"}]
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    choice = r.choices[0]
    m = choice.message
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
    check(m.content == "Let me check.", f"content {m.content!r}")
    check(getattr(m, "reasoning_content", None)
          == 'Maybe <tool_call>{"name": "draft"}</tool_call> first.', f"reasoning {m}")
    calls = m.tool_calls or []
    check([c.function.name for c in calls] == ["get_weather", "get_time"], f"calls {calls}")
    check(json.loads(calls[0].function.arguments) == {"city": "Zürich"}, "arguments")
    check(calls[1].function.arguments == "{}", "a parameterless call's arguments")
    check(all(c.type == "function" and c.id.startswith("call_") for c in calls), "ids, types")
    check(len({c.id for c in calls}) == 2, "distinct ids")

    # Streamed: the same message from the deltas.
    content, reasoning, scalls, finish = streamed(client, model, messages)
    check(content == m.content and reasoning == m.reasoning_content, "streamed text")
    check(finish == "tool_calls", f"streamed finish {finish}")
    check([(scalls[i][1], scalls[i][2]) for i in sorted(scalls)]
          == [(c.function.name, c.function.arguments) for c in calls], f"streamed {scalls}")
    check(all(scalls[i][0].startswith("call_") for i in scalls), "streamed ids")

    # The round trip: the assistant's calls and the tools' results go back in the history.
    messages.append(m.model_dump(exclude_none=True))
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.id, "content": run_tool(c)})
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    final = r.choices[0]
    check(final.message.content == "It is 22 °C and sunny in Zürich.", f"final {final.message}")
    check(final.finish_reason == "stop" and not final.message.tool_calls, "final is an answer")
    content, _, scalls, finish = streamed(client, model, messages)
    check(content == final.message.content and not scalls and finish == "stop", "streamed final")

    # Typed errors for bad tool requests.
    try:
        client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
        check(False, "an unknown tool_choice was accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "tool_choice", f"tool_choice error {e.body}")


def real(url):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}]:
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           tool_choice=choice, temperature=0, max_tokens=48)
        c = r.choices[0]
        check(c.finish_reason in ("stop", "length", "tool_calls"), f"{choice}: {c}")
        for call in c.message.tool_calls or []:
            check(call.function.name in ("get_weather", "get_time"), f"{choice}: {call}")
            check(isinstance(json.loads(call.function.arguments), dict), f"{choice}: {call}")
        content, _, calls, finish = streamed(client, model, messages, tool_choice=choice,
                                             temperature=0, max_tokens=48)
        check(content == (c.message.content or "") and finish == c.finish_reason,
              f"{choice}: streamed {content!r} vs {c.message.content!r}")
        check(len(calls) == len(c.message.tool_calls or []), f"{choice}: streamed calls")


def qwen(url):
    """Qwen2.5-Coder-0.5B answers a weather question with a call (a bare JSON object, which
    the parser returns as a call because it names an offered tool and is the whole answer).
    With the result in the history it answers in text: greedy, it repeats the call and the
    result as its answer (llama-server gives the same text), which must stay content."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    check(model == "qwen2.5-coder-0.5b", f"served name {model}")
    messages = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0)
    c, m = r.choices[0], r.choices[0].message
    check(c.finish_reason == "tool_calls" and not m.content, f"qwen: {c}")
    calls = m.tool_calls or []
    check([(t.function.name, json.loads(t.function.arguments)) for t in calls]
          == [("get_weather", {"city": "Paris"})], f"qwen calls {calls}")
    content, _, scalls, finish = streamed(client, model, messages, temperature=0)
    check(not content and finish == "tool_calls"
          and [(v[1], v[2]) for v in scalls.values()]
          == [(t.function.name, t.function.arguments) for t in calls], f"qwen streamed {scalls}")

    # Asked this way it writes the call in a ```json fence: a call too, streamed or not.
    fenced = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=model, messages=fenced, tools=TOOLS, temperature=0)
    c = r.choices[0]
    got = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or []]
    check(c.finish_reason == "tool_calls" and not c.message.content
          and got == [("get_weather", {"city": "Paris"})], f"qwen fenced: {c}")
    content, _, scalls, finish = streamed(client, model, fenced, temperature=0)
    check(not content and finish == "tool_calls"
          and [(v[1], json.loads(v[2])) for v in scalls.values()] == got,
          f"qwen fenced streamed {content!r} {scalls}")

    # The Responses API: the same call as a function_call item (its tools strict by default).
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = client.responses.create(model=model, input="What is the weather in Paris?", tools=tools,
                                temperature=0)
    got = [(i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"]
    check(r.status == "completed" and got == [("get_weather", {"city": "Paris"})],
          f"qwen responses: {r.output}")

    messages.append(m.model_dump(exclude_none=True))
    for t in calls:
        messages.append({"role": "tool", "tool_call_id": t.id, "content": run_tool(t)})
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0)
    final = r.choices[0]
    check(final.finish_reason == "stop" and not final.message.tool_calls
          and "22" in (final.message.content or ""), f"qwen final {final}")
    content, _, scalls, finish = streamed(client, model, messages, temperature=0)
    check(content == final.message.content and not scalls and finish == "stop",
          f"qwen streamed final {content!r}")


scripted(sys.argv[1])
real(sys.argv[2])
if len(sys.argv) > 3:
    qwen(sys.argv[3])
print(f"openai tools: {checks} checks passed (openai {openai.__version__})")
