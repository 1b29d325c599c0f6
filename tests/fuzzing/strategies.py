"""Hypothesis strategies for hostile inputs: schemas, regexes, Lark, templates, contents,
CLI arguments. Shared by tests/test_fuzz.py (a bounded slice) and bench/fuzz.py (longer)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SPECIAL = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<end_of_turn>", "[INST]",
           "</tool_call>", "<tool_call>", "<|eot_id|>"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=12)
types = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array",
                         "strng", 7])
keywords = st.sampled_from(["type", "minimum", "maximum", "exclusiveMinimum", "minLength",
                            "maxLength", "pattern", "format", "enum", "const", "multipleOf",
                            "minItems", "maxItems", "uniqueItems", "required", "not",
                            "additionalProperties", "$ref", "$defs", "if", "contains",
                            "minProperties", "propertyNames", "default", "title"])


def _schema(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    node = st.fixed_dictionaries({}, optional={
        "type": st.one_of(types, st.lists(types, max_size=3)),
        "properties": st.dictionaries(st.text(max_size=5), children, max_size=3),
        "items": children,
        "anyOf": st.lists(children, max_size=3),
        "oneOf": st.lists(children, max_size=3),
        "allOf": st.lists(children, max_size=2),
        "$defs": st.dictionaries(st.sampled_from(["a", "b"]), children, max_size=2),
        "$ref": st.sampled_from(["#", "#/$defs/a", "#/$defs/b", "#/nope", "http://x/y"]),
    })
    extra = st.dictionaries(keywords, json_values, max_size=3)
    return st.builds(lambda a, b: {**b, **a}, node, extra)


schemas = st.recursive(st.one_of(st.booleans(), st.just({}), st.builds(
    lambda t: {"type": t}, types)), _schema, max_leaves=10)

regexes = st.one_of(
    st.text(alphabet="ab()[]{}|*+?.\\^$0123456789,-dws", max_size=24),
    st.builds(lambda n: f"a{{{n}}}", st.integers(0, 10**7)),
)

lark_grammars = st.one_of(
    st.text(max_size=40),
    st.builds(lambda body: f"start: {body}", st.text(alphabet='ab"/|()*+?: %json{}', max_size=30)),
)

_jinja_bits = [
    "{{ messages[0]['content'] }}", "{% for m in messages %}{{ m.role }}{% endfor %}",
    "{{ raise_exception('no') }}", "{% for i in range(100000) %}{% endfor %}",
    "{{ 'x' * 10 }}", "{{ messages|tojson }}", "{{ messages[5] }}", "{% if x %}", "{{",
    "{% set ns = namespace(s='a') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}", "{{ 9 ** 9 ** 9 }}", "{{ ''.__class__ }}", "<|im_start|>", "{% break %}",
    "{{ strftime_now('%Y') }}", "{{ m.content.split('<')[0] }}", "{% generation %}x"
    "{% endgeneration %}",
]
templates = st.lists(st.one_of(st.sampled_from(_jinja_bits), st.text(max_size=8)),
                     max_size=6).map("".join)

contents = st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=10)),
                    max_size=8).map("".join)

cli_args = st.lists(st.one_of(
    st.sampled_from(["--json-schema", "--regex", "--lark", "--temperature", "--max-tokens",
                     "--seed", "--top-p", "--stop", "--no-think", "--json", "--threads",
                     "--system", "--bogus"]),
    st.text(max_size=20), st.sampled_from(["1e308", "-1", "0", "nan", "@/nonexistent",
                                           '{"type": "string"}', "a{1000000}"])),
    max_size=6)


# OpenAI request bodies: right fields with wrong shapes, and the odd right one.
_roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "robot", 3])
_content = st.one_of(st.none(), st.text(max_size=20), st.integers(),
                     st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"),
                                                               "text": st.text(max_size=8)}),
                                        json_values), max_size=3))
_message = st.one_of(json_values, st.fixed_dictionaries(
    {"role": _roles}, optional={"content": _content, "tool_call_id": json_values,
                                "tool_calls": json_values, "reasoning_content": json_values,
                                "name": json_values}))
_tool = st.one_of(json_values, st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=8), json_values)},
        optional={"parameters": st.one_of(schemas, json_values), "description": json_values})}))
OPENAI_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": json_values, "messages": st.one_of(json_values, st.lists(_message, max_size=4)),
    "prompt": st.one_of(json_values, st.lists(st.integers(-5, 60000), max_size=5)),
    "tools": st.one_of(json_values, st.lists(_tool, max_size=3)),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "x"]), json_values),
    "response_format": st.one_of(json_values, st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
        optional={"schema": schemas, "json_schema": json_values})),
    "structured_outputs": json_values, "temperature": json_values, "top_p": json_values,
    "n": json_values, "max_tokens": json_values, "max_completion_tokens": json_values,
    "stop": json_values, "seed": json_values, "stream": json_values,
    "stream_options": json_values, "parallel_tool_calls": json_values,
    "chat_template_kwargs": json_values, "reasoning_effort": json_values,
    "logprobs": json_values, "frequency_penalty": json_values}
# wrong-typed scalars as often as the field's own shapes
OPENAI_FIELDS = {key: st.one_of(scalars, value) for key, value in OPENAI_FIELDS.items()}
_fields = st.fixed_dictionaries({}, optional=OPENAI_FIELDS)
# Well-formed messages and prompt, to pair with ONE hostile field (tests/test_fuzz.py), so
# every field's parser is reached (a body with many bad fields is refused at the first).
OPENAI_OK = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
openai_bodies = st.one_of(json_values, _fields)
