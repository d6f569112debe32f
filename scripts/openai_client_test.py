"""The official `openai` Python client against a running `specula serve`.

Usage: python3 scripts/openai_client_test.py BASE_URL   (e.g. http://127.0.0.1:30000/v1)
Drives chat and completions, streamed and not, usage, n, logprobs, stop strings and errors the
way applications do; exits non-zero on the first failed check. scripts/test-openai.sh runs it.
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"openai client check failed: {what}")
    checks += 1


question = [{"role": "user", "content": "Name the capital city of France."}]

# Chat, whole response.
r = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0)
text = r.choices[0].message.content
check("Paris" in text, f"chat answer {text!r}")
check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
u = r.usage
check(u.total_tokens == u.prompt_tokens + u.completion_tokens > 0, f"usage {u}")

# Chat, streamed, with usage at the end: the same text.
parts, usage, finish = [], None, None
for chunk in client.chat.completions.create(
    model=model, messages=question, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        finish = c.finish_reason or finish
check("".join(parts) == text, f"streamed {''.join(parts)!r} vs {text!r}")
check(usage is not None and usage.completion_tokens == u.completion_tokens, f"stream usage {usage}")
check(finish == r.choices[0].finish_reason, "stream finish_reason")

# Stop strings, n, log-probabilities.
r = client.chat.completions.create(
    model=model, messages=question, max_tokens=24, temperature=0, stop=["Paris"]
)
check("Paris" not in r.choices[0].message.content, "stop string sent")
check(r.choices[0].finish_reason == "stop", "stop finish_reason")
r = client.chat.completions.create(
    model=model, messages=question, max_tokens=8, n=3, seed=1, logprobs=True, top_logprobs=2
)
check(len(r.choices) == 3, "n=3")
lp = r.choices[0].logprobs.content
check(len(lp) >= 1 and len(lp[0].top_logprobs) == 2 and lp[0].logprob <= 0, "chat logprobs")

# Completions, whole and streamed.
c = client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=16, temperature=0,
    extra_body={"ignore_eos": True},
)
check(c.usage.completion_tokens == 16 and c.choices[0].finish_reason == "length", f"completion {c}")
streamed = "".join(
    ch.choices[0].text
    for ch in client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=16, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    if ch.choices
)
check(streamed == c.choices[0].text, f"streamed completion {streamed!r}")

# Errors arrive as the client's typed exceptions with the status and parameter.
for kwargs, param in [
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"model": "no-such-model"}, "model"),
]:
    args = {"model": model, "messages": question, "max_tokens": 4, **kwargs}
    try:
        client.chat.completions.create(**args)
        check(False, f"{kwargs} accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == param, f"{kwargs}: {e.body}")
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    check(False, "empty messages accepted")
except openai.BadRequestError as e:
    check(e.body.get("param") == "messages", f"empty messages: {e.body}")

print(f"openai client: {checks} checks passed (openai {openai.__version__})")
