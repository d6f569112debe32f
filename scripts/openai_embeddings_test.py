"""`/v1/embeddings` through the official `openai` Python client against `specula serve`.

Usage: python3 scripts/openai_embeddings_test.py URL   (base URL ending in /v1)
Vectors have the model's width and unit length; on a small similarity set every related pair
scores higher than each unrelated one; `base64` and `float` give the same numbers; `dimensions`
keeps the leading values renormalised; token ids embed as their text does (the same bits: the
engine is batch-invariant); bad requests are typed errors. scripts/test-openai.sh runs it.
"""

import base64
import json
import math
import struct
import sys
import urllib.request

import openai

url = sys.argv[1]
client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
model = client.models.list().data[0].id
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"openai embeddings check failed: {what}")
    checks += 1


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


PAIRS = [
    ("The cat sat on the mat.", "A kitten is resting on the rug."),
    ("How do I bake bread?", "What is a good recipe for baking a loaf of bread?"),
    ("The stock market fell sharply today.", "Shares dropped a lot on Wall Street today."),
    ("Python is a programming language.", "I write code in Python every day."),
    ("It is raining heavily outside.", "There is a big storm with lots of rain."),
    ("She plays the violin beautifully.", "Her violin performance was wonderful."),
]
texts = [t for pair in PAIRS for t in pair]
r = client.embeddings.create(model=model, input=texts, encoding_format="float")
vectors = [d.embedding for d in r.data]
check([d.index for d in r.data] == list(range(len(texts))), "indices in order")
width = len(vectors[0])
check(width > 100 and all(len(v) == width for v in vectors), f"width {width}")
check(all(abs(math.sqrt(dot(v, v)) - 1) < 1e-4 for v in vectors), "unit length")
check(r.usage.prompt_tokens == r.usage.total_tokens > len(texts), f"usage {r.usage}")
for i in range(len(PAIRS)):
    related = dot(vectors[2 * i], vectors[2 * i + 1])
    for j in range(len(PAIRS)):
        if j != i:
            for k in (0, 1):
                other = dot(vectors[2 * i], vectors[2 * j + k])
                check(related > other, f"{PAIRS[i]} {related:.3f} <= {texts[2 * j + k]!r} {other:.3f}")

# base64: the same numbers (the SDK decodes its own default, base64, too).
raw = client.embeddings.with_raw_response.create(model=model, input=texts[:2],
                                                 encoding_format="base64")
body = json.loads(raw.text)
for d, v in zip(body["data"], vectors):
    b = base64.b64decode(d["embedding"])
    check(list(struct.unpack(f"<{len(b) // 4}f", b)) == v, "base64 = float")
check(client.embeddings.create(model=model, input=texts[0]).data[0].embedding == vectors[0],
      "the SDK's default (base64) decodes to the float vector")

# dimensions: the leading values, renormalised.
short = client.embeddings.create(model=model, input=texts[0], dimensions=64,
                                 encoding_format="float").data[0].embedding
norm = math.sqrt(dot(vectors[0][:64], vectors[0][:64]))
check(len(short) == 64 and all(abs(a - b / norm) < 1e-6 for a, b in zip(short, vectors[0])),
      "dimensions")

# Token ids embed as the text they spell (with the BOS the text gets).
req = urllib.request.Request(url.removesuffix("/v1") + "/tokenize", method="POST",
                             data=json.dumps({"content": texts[0], "add_special": True}).encode())
with urllib.request.urlopen(req) as resp:
    ids = json.load(resp)["tokens"]
by_ids = client.embeddings.create(model=model, input=[ids], encoding_format="float")
check(by_ids.data[0].embedding == vectors[0], "token ids = text")

for bad, what in ((dict(input=[]), "input"), (dict(input="hi", dimensions=0), "dimensions"),
                  (dict(input=""), "input"), (dict(input="hi", model="other"), "model"),
                  (dict(input="hi", encoding_format="int8"), "encoding_format")):
    try:
        client.embeddings.create(**dict(dict(model=model), **bad))
        check(False, f"{what}: accepted")
    except openai.BadRequestError as e:
        check(e.body.get("param") == what, f"{what}: {e.body}")

print(f"openai embeddings: {checks} checks passed")
