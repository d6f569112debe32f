"""OpenAI's Responses API through the official `openai` Python client against `specula serve`.

Usage: python3 scripts/openai_responses_test.py REAL_URL SCRIPTED_URL
(base URLs ending in /v1: the default model with --tool-call-parser hermes --reasoning-parser
qwen3, and the same with --scripted-output crates/specula/tests/fixtures/tool_script.json).
On the real model: `responses.create` and `responses.stream` give the same greedy text (the
events typed, numbered, from `response.created` to `response.completed`); `previous_response_id`
continues a stored conversation, `store: false` keeps nothing; retrieve and delete;
`responses.parse` with a Pydantic model; `max_output_tokens` makes the response incomplete; bad
requests are typed errors. On the scripted server: reasoning, message and function_call items,
streamed and not, and the round trip with function_call_output items, by the whole input and by
`previous_response_id`. Exits non-zero on the first failed check. scripts/test-openai.sh runs it.
"""

import json
import sys

import openai
from pydantic import BaseModel, Field

real_url, scripted_url = sys.argv[1:3]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"openai responses check failed: {what}")
    checks += 1


client = openai.OpenAI(base_url=real_url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
base = dict(model=model, instructions="Answer in one sentence.", temperature=0,
            max_output_tokens=40)

r = client.responses.create(input="What is the capital of France?", **base)
check(r.object == "response" and r.id.startswith("resp_") and r.model == model, f"shape {r}")
check(r.status in ("completed", "incomplete") and r.output_text, f"status/text {r}")
check([i.type for i in r.output] == ["message"], f"items {r.output}")
check(r.usage.input_tokens > 5 and r.usage.output_tokens > 0
      and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, f"usage {r.usage}")
check(r.instructions == base["instructions"] and r.store is True, "echoed fields")

# Streamed: numbered, typed events; the deltas make the same text.
events = list(client.responses.create(input="What is the capital of France?", stream=True, **base))
types = [e.type for e in events]
check(types[:2] == ["response.created", "response.in_progress"], f"first events {types[:3]}")
check(types[-1] == "response.completed", f"last event {types[-1]}")
check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check(deltas == r.output_text, f"streamed {deltas!r} != {r.output_text!r}")
check(events[-1].response.output_text == r.output_text, "completed event's response")
with client.responses.stream(input="What is the capital of France?", **base) as s:
    final = s.get_final_response()
check(final.output_text == r.output_text, f"stream helper {final.output_text!r}")

# A stored conversation goes on; one made with store=False is not kept.
r2 = client.responses.create(input="And of Spain?", previous_response_id=r.id, **base)
check(r2.output_text and r2.previous_response_id == r.id, f"continued {r2}")
check(r2.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, "history in the prompt")
check(client.responses.retrieve(r.id).output_text == r.output_text, "retrieve")
ephemeral = client.responses.create(input="Hi", store=False, **base)
for call in (lambda: client.responses.retrieve(ephemeral.id),
             lambda: client.responses.create(input="x", previous_response_id=ephemeral.id, **base)):
    try:
        call()
        check(False, "a store=False response was found")
    except openai.NotFoundError:
        checks += 1
client.responses.delete(r2.id)
try:
    client.responses.retrieve(r2.id)
    check(False, "a deleted response was found")
except openai.NotFoundError:
    checks += 1


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


parsed = client.responses.parse(input="Where is Paris? Answer as JSON.", text_format=City,
                                model=model, temperature=0, max_output_tokens=60)
check(isinstance(parsed.output_parsed, City), f"parse {parsed.output_parsed!r}")

short = client.responses.create(input="Tell me a long story.", **dict(base, max_output_tokens=3))
check(short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens",
      f"short {short.status} {short.incomplete_details}")
check(short.usage.output_tokens == 3, f"short usage {short.usage}")

for bad, what in ((dict(tools=[{"type": "web_search"}]), "web_search"),
                  (dict(extra_body={"frequency_penalty": 1}), "frequency_penalty"),
                  (dict(input=[{"type": "item_reference", "id": "x"}]), "item_reference")):
    try:
        client.responses.create(**dict(dict(base, input="Hi"), **bad))
        check(False, f"{what}: accepted")
    except openai.BadRequestError as e:
        check(what in str(e), f"{what}: {e}")

# The scripted server: reasoning, text and two calls; then the round trip.
client = openai.OpenAI(base_url=scripted_url, api_key="unused", max_retries=0)
tools = [
    {"type": "function", "name": "get_weather", "description": "The weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"], "additionalProperties": False}},
    {"type": "function", "name": "get_time", "description": "The time now.",
     "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
]
question = [{"role": "user", "content": "What is the weather in Zürich?"}]
r = client.responses.create(model=model, input=question, tools=tools)
kinds = [i.type for i in r.output]
check(kinds == ["reasoning", "message", "function_call", "function_call"], f"items {kinds}")
check(r.output[0].content[0].text == 'Maybe <tool_call>{"name": "draft"}</tool_call> first.',
      f"reasoning {r.output[0]}")
check(r.output[1].content[0].text == "Let me check.", f"message {r.output[1]}")
calls = r.output[2:]
check([(c.name, json.loads(c.arguments)) for c in calls]
      == [("get_weather", {"city": "Zürich"}), ("get_time", {})], f"calls {calls}")
check(len({c.call_id for c in calls}) == 2 and all(c.id.startswith("fc_") for c in calls), "ids")
with client.responses.stream(model=model, input=question, tools=tools) as s:
    final = s.get_final_response()
check([i.type for i in final.output] == kinds, f"streamed items {final.output}")
check([(c.name, c.arguments) for c in final.output[2:]] == [(c.name, c.arguments) for c in calls],
      "streamed calls")

results = {"get_weather": json.dumps({"temperature_c": 22, "sky": "sunny"}), "get_time": "12:00"}
outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": results[c.name]}
           for c in calls]
answer = client.responses.create(model=model, input=question + r.output + outputs, tools=tools)
check(answer.output_text == "It is 22 °C and sunny in Zürich.", f"answer {answer.output}")
again = client.responses.create(model=model, previous_response_id=r.id, input=outputs, tools=tools)
check(again.output_text == answer.output_text, f"answer by previous_response_id {again.output}")

print(f"openai responses: {checks} checks passed")
