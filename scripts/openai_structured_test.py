"""Structured outputs through the official `openai` Python client against `specula serve`.

Usage: python3 scripts/openai_structured_test.py PLAIN_URL SPEC_URL TOOLS_URL
(base URLs ending in /v1: a server without speculation, one with EAGLE-3, one with
--tool-call-parser hermes). For a table of schemas, streamed and not, at temperatures 0 and 1,
every answer validates (`jsonschema`); `client.chat.completions.parse()` with a Pydantic model
round-trips; the greedy answers with speculation are the ones without; an invalid schema is a
BadRequestError; a forced tool call's arguments validate against its parameters; Pydantic
models of every common type parse (a set's `uniqueItems` named in `x-specula-unenforced`), and
`strict: true` closes objects. Exits non-zero
on the first failed check. scripts/test-openai.sh runs it.
"""

import datetime as dt
import json
import sys
from typing import Annotated, Dict, List, Literal, Optional, Set, Union
from uuid import UUID

import jsonschema
import openai
from pydantic import BaseModel, EmailStr, Field

plain_url, spec_url, tools_url = sys.argv[1:4]
clients = {u: openai.OpenAI(base_url=u, api_key="unused", max_retries=0) for u in sys.argv[1:4]}
model = clients[plain_url].models.list().data[0].id
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"openai structured-output check failed: {what}")
    checks += 1


SCHEMAS = [
    ("Describe a person called Ana who is 31, as JSON.",
     {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                       "age": {"type": "integer", "minimum": 0, "maximum": 120}},
      "required": ["name", "age"], "additionalProperties": False}),
    ("Where is Paris? Answer as JSON.",
     {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 20},
         "country": {"type": "object", "properties": {
             "name": {"type": "string", "maxLength": 20},
             "code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
             "required": ["name", "code"], "additionalProperties": False}},
      "required": ["city", "country"], "additionalProperties": False}),
    ("Name some colours of the rainbow, as JSON.",
     {"type": "object", "properties": {"colors": {
         "type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]},
         "minItems": 2, "maxItems": 3}},
      "required": ["colors"], "additionalProperties": False}),
    ("What is the weather like in Madrid today? Answer as JSON.",
     {"type": "object", "properties": {
         "temperature": {"type": "number", "minimum": -50, "maximum": 60},
         "unit": {"enum": ["C", "F"]},
         "note": {"anyOf": [{"type": "string", "maxLength": 15}, {"type": "null"}]}},
      "required": ["temperature", "unit", "note"], "additionalProperties": False}),
]


def ask(url, prompt, schema, temperature, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    kwargs = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=200,
                  temperature=temperature, seed=7, response_format=fmt)
    if not stream:
        c = clients[url].chat.completions.create(**kwargs).choices[0]
        return c.message.content, c.finish_reason
    parts, finish = [], None
    for chunk in clients[url].chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), finish


greedy = {}
for prompt, schema in SCHEMAS:
    for stream in (False, True):
        for temperature in (0.0, 1.0):
            text, finish = ask(plain_url, prompt, schema, temperature, stream)
            check(finish == "stop", f"finish {finish} for {text!r}")
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                check(False, f"{text!r} against {schema}: {e}")
            checks += 1
            if temperature == 0.0:
                greedy[prompt] = text

# With speculation (EAGLE-3), streamed or not, the greedy answers are the same.
for prompt, schema in SCHEMAS:
    for stream in (False, True):
        text, _ = ask(spec_url, prompt, schema, 0.0, stream)
        check(text == greedy[prompt], f"speculation changed {greedy[prompt]!r} into {text!r}")


class Country(BaseModel):
    name: str = Field(max_length=20)
    code: str = Field(pattern="^[A-Z]{2}$")


class Place(BaseModel):
    city: str = Field(max_length=20)
    country: Country
    languages: List[Literal["French", "English", "Spanish"]] = Field(max_length=2)
    population_millions: Optional[int] = Field(ge=0, le=50)


for url in (plain_url, spec_url):
    # `.parse()` moved out of `beta` in later releases of the package.
    completions = clients[url].chat.completions
    parse = getattr(completions, "parse", None) or clients[url].beta.chat.completions.parse
    r = parse(
        model=model, messages=[{"role": "user", "content": "Where is Paris? Answer as JSON."}],
        response_format=Place, max_tokens=200, temperature=0)
    parsed = r.choices[0].message.parsed
    check(isinstance(parsed, Place), f".parse() gave {parsed!r}")
    check(len(parsed.country.code) == 2, f"country code {parsed.country.code!r}")

# Every schema Pydantic v2 writes for common types, through `.parse()`: sets (`uniqueItems`,
# accepted best-effort and named in a response header), dates and times, UUIDs, emails,
# `Literal`, `Optional`, nested models, `dict[str, T]`, a discriminated union, a recursive model.
class Contact(BaseModel):
    email: EmailStr
    id: UUID
    born: dt.date
    last_seen: dt.datetime
    wakes_at: dt.time


class Labels(BaseModel):
    tags: Set[str] = Field(max_length=3)
    level: Literal["low", "high"]
    note: Optional[str] = Field(max_length=20)
    scores: Dict[str, Annotated[int, Field(ge=0, le=10)]] = Field(max_length=2)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    name: str = Field(max_length=12)
    pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]


class Node(BaseModel):
    name: str = Field(max_length=12)
    children: List["Node"] = Field(max_length=2)


PYDANTIC = [
    (Contact, "Make up a contact card for Ana, as JSON."),
    (Labels, "Label this text: 'the server is down again'. Give tags, a level, a note, and "
             'the scores {"urgency": 8, "impact": 6}. Answer as JSON.'),
    (Pet, "Describe a cat called Tom, as JSON."),
    # A small model left to itself nests without end; the tree is in the prompt.
    (Node, 'Repeat this tree as JSON: {"name": "Ana", "children": [{"name": "Ben", '
           '"children": []}, {"name": "Cy", "children": []}]}'),
]
for cls, prompt in PYDANTIC:
    for temperature in (0.0, 0.7):
        r = parse(model=model, messages=[{"role": "user", "content": prompt}],
                  response_format=cls, max_tokens=400, temperature=temperature, seed=3)
        parsed = r.choices[0].message.parsed
        check(isinstance(parsed, cls), f"{cls.__name__}: .parse() gave {parsed!r}")
        # The answer validates against the schema Pydantic wrote, not only Pydantic's lax rules.
        jsonschema.validate(json.loads(r.choices[0].message.content), cls.model_json_schema())

# The header names the set that was not held to uniqueItems; it is absent where nothing was.
def unenforced(cls):
    fmt = {"type": "json_schema", "json_schema": {"name": cls.__name__,
                                                  "schema": cls.model_json_schema()}}
    raw = clients[plain_url].chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Some JSON, please."}],
        response_format=fmt, max_tokens=60, temperature=0)
    return raw.headers.get("x-specula-unenforced")


check(unenforced(Labels) == "uniqueItems at /properties/tags", f"header {unenforced(Labels)!r}")
check(unenforced(Pet) is None, f"header {unenforced(Pet)!r}")

# `strict: true` closes every object (OpenAI's strict mode): keys the schema does not name never
# appear, even when the prompt asks for them.
open_schema = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"]}},
    "required": ["name", "address"]}
for temperature in (0.0, 1.0):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": open_schema,
                                                  "strict": True}}
    r = clients[plain_url].chat.completions.create(
        model=model, max_tokens=200, temperature=temperature, seed=5, response_format=fmt,
        messages=[{"role": "user", "content":
                   "Describe Ana from Paris as JSON with name, age, job and address "
                   "(city, street, zip)."}])
    answer = json.loads(r.choices[0].message.content)
    check(set(answer) == {"name", "address"} and set(answer["address"]) == {"city"},
          f"strict answer {answer}")

# json_object: an object.
r = clients[plain_url].chat.completions.create(
    model=model, messages=[{"role": "user", "content":
                            "Return a JSON object with the keys city and country for Paris."}],
    response_format={"type": "json_object"}, max_tokens=200, temperature=0)
check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object answer")

# An invalid schema is a 400 before anything runs.
try:
    clients[plain_url].chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}})
    check(False, "an unsatisfiable schema was accepted")
except openai.BadRequestError as e:
    check("cannot be used" in str(e), f"error message {e}")

# A forced tool call's arguments validate against its parameters.
weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather,
                                           "strict": True}}]
for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
    r = clients[tools_url].chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools, tool_choice=choice, max_tokens=100, temperature=1, seed=4)
    call = r.choices[0].message.tool_calls[0].function
    check(call.name == "get_weather", f"call {call}")
    jsonschema.validate(json.loads(call.arguments), weather)

print(f"openai structured outputs: {checks} checks passed")
