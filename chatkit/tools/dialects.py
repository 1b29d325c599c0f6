"""Tool-call dialects as data: how each model family writes its calls.

A :class:`Dialect` is a small record. A call is a sequence of *pieces*: literal markup and
slots (the tool's name, a call id, the call's index in the turn, the arguments), so one
record says ``<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`` (Hermes),
``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]ARGS`` (Mistral v11) or
``<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>ARGS<|tool_call_end|>``
(Kimi K2). Around the calls: an optional per-turn section, a separator between parallel
calls, a cap on calls per turn; around plain text: an optional wrapper (harmony's final
channel, Command R7B's response). Arguments are encoded one of five ways
(:class:`Args`): a JSON object, XML-like key/value pairs (a parameter the schema types as
string is raw text, any other is JSON), Python keyword arguments, Gemma 4's keyed
values (``city:<|"|>Oslo<|"|>,days:3``), or MiniMax M3's nested elements.

The same record drives the grammar (:mod:`.grammar`), the parser (:mod:`.parser`), the
wire text of stored calls (:func:`render_calls`, what detection compares a template's
rendering with, and what goes into content where a template drops calls) and the history
adapter (:mod:`.detect`): ids in the family's scheme, arguments as the template wants
them. Markers are text here; they become token ids only against a vocabulary.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..messages import ToolCall

__all__: list[str] = []


class Slot(enum.Enum):
    """A call piece the model fills in."""

    NAME = "name"
    """The tool's name (one of the turn's tools)."""
    ID = "id"
    """The call id, written by the model in the dialect's ``ids`` scheme."""
    INDEX = "index"
    """The call's position in the turn (0, 1, ...)."""
    ARGS = "args"
    """The arguments, encoded as ``Dialect.args`` says."""


NAME, ID, INDEX, ARGS = Slot.NAME, Slot.ID, Slot.INDEX, Slot.ARGS
Piece = str | Slot


@dataclass(frozen=True)
class Args:
    """How arguments are written.

    - ``json``: one JSON object (the tool's parameter schema).
    - ``xml``: per parameter ``key_open KEY key_close VALUE value_close``; a value whose
      schema resolves to string is raw text (it cannot contain ``value_close``), any other
      value is JSON.
    - ``python``: ``key=value`` joined by ``separator``; strings quoted with ``quote``,
      booleans ``True``/``False``, null ``None``, numbers, lists and dicts as JSON.
    - ``gemma``: ``key:value`` joined by ``separator`` in key order (Jinja's ``dictsort``:
      case-insensitive), keys bare; a string is raw text between two ``quote`` markers (it
      cannot contain the marker), booleans ``true``/``false``, null ``None``, numbers as
      Python writes them, lists ``[a,b]`` and objects ``{key:value,...}`` (keys sorted
      and bare) of such values (Gemma 4's template).
    - ``tree``: per parameter an element ``key_open KEY key_close VALUE value_close </KEY>``;
      a string raw, a number or ``true``/``false`` as written, an object its properties as
      such elements, a list ``item`` elements; a null value is left out (MiniMax M3's
      template).
    """

    kind: Literal["json", "xml", "python", "gemma", "tree"] = "json"
    key_open: str = ""
    key_close: str = ""
    value_close: str = ""
    separator: str = ""
    quote: str = '"'
    key_close_json: str = ""
    """XML: the key's closing markup before a JSON (not raw) value where it differs from
    ``key_close`` (DeepSeek V3.2's ``string="false">`` against ``string="true">``); a
    ``{type}`` in it is the value's JSON type (Kimi K3's ``type="number"``: see
    :func:`json_tag`)."""


JSON_ARGS = Args()


@dataclass(frozen=True)
class Dialect:
    """One family's tool-call format (see the module docstring)."""

    name: str
    call: tuple[Piece, ...]
    """One call: literal markup and slots."""
    section: tuple[str, str] | None = None
    """Markup opening and closing the turn's calls, when the family has it."""
    separator: str = ""
    """Between parallel calls."""
    args: Args = JSON_ARGS
    ids: Literal["none", "alnum9", "index", "kimi"] = "none"
    """Call ids: none (chatkit numbers them), Mistral's 9 alphanumerics (written by the
    model in the ``ID`` slot), the call's index as a string (Command R7B), or Kimi's
    ``functions.NAME:INDEX``."""
    max_calls: int | None = None
    """Calls a turn may hold (1 where the family makes one call per turn)."""
    text_open: str = ""
    text_close: str = ""
    """Markup around a plain-text reply (harmony's final channel, Command R7B)."""
    stops: tuple[str, ...] = ()
    """Markup that ends the model's turn after its calls on the family's own vocabulary
    (documentation; a grammar ends the turn itself)."""
    families: tuple[str, ...] = ()
    """Model families that write this dialect (for docs and logs)."""
    # -- history: what the template needs to render stored calls back
    args_as: Literal["dict", "string"] = "dict"
    """``arguments`` as the template reads them: a mapping, or JSON text."""
    renders_calls: bool = True
    """False where the template drops ``tool_calls`` (Granite 3.3, LFM2, Phi-4-mini): the
    calls then go into the assistant's content, in this dialect's markup."""
    signature: tuple[str, ...] = field(default=())
    """For templates that never render calls: source text that identifies the family."""
    # -- learned from the template's renderings (detect.py), as the family writes a turn
    json_separators: tuple[str, str] = (",", ":")
    """JSON's item and key separators inside arguments, as the template writes them
    (``tojson`` writes ``", "`` and ``": "``; compact where it strips them)."""
    text_before: bool = False
    """A turn may say text before its calls (the template renders content, then calls);
    only where the calls open with markup, so the text's end is unambiguous."""
    text_lead: tuple[str, str] | None = None
    """Markup around text written before the calls where the text is not simply followed
    by the calls' markup word (Llama 4's ``<|python_start|>`` ... ``<|python_end|>``,
    Functionary v3.2's ``all\n`` ... ``>>>``): the calls follow its closing markup."""
    reasoning: tuple[str, str] | None = None
    """The think block's opening and closing markup as the template writes it before a
    reply (``("<think>\n", "\n</think>\n\n")``), where it renders reasoning."""
    think_closed: bool = False
    """A reply without reasoning still writes the think block's close (MiniMax M3 opens
    each such turn with ``</mm:think>``)."""
    text_json: bool = False
    """Plain text is written as a JSON string inside ``text_open`` / ``text_close`` (the
    generic envelope's ``{"response": ...}``)."""

    json_indent: tuple[int, int] | None = None
    """JSON arguments written indented (``tojson(indent=N)``) and shifted under the call's own
    indent (Command R+'s ``| indent(8)``): ``(N, shift)``; the grammar then takes any layout
    of spaces and line breaks between JSON tokens (an indent that grows with depth is no
    fixed separator)."""
    first_index: int = 0
    """The ``INDEX`` slot of a turn's first call (Kimi K3 counts from 1)."""

    @property
    def trigger(self) -> str:
        """The text a reply's calls begin with ("" when a call begins with its name)."""
        first = self.section[0] if self.section else ""
        if first:
            return first
        out = ""
        for piece in self.call:
            if not isinstance(piece, str):
                break
            out += piece
        return out

    def call_id(self, name: str, index: int, written: str | None) -> str:
        """The id of a parsed call: the one the model wrote, else from the scheme, else
        chatkit's ``call_N`` (``written`` is None then)."""
        if self.ids == "kimi":
            return f"functions.{name}:{index}"
        if written is not None and self.ids == "alnum9":
            return written
        return ""

    def history_id(self, call_id: str) -> str:
        """A stored id in the form the template accepts: Mistral's templates refuse ids
        that are not 9 alphanumerics, so any other id maps to a stable 9-character one
        (the same for the call and its result)."""
        if self.ids != "alnum9" or (len(call_id) == 9 and call_id.isascii()
                                    and call_id.isalnum()):
            return call_id
        digest = hashlib.sha256(call_id.encode()).digest()
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        return "".join(alphabet[b % len(alphabet)] for b in digest[:9])


# ------------------------------------------------------------------ wire text
def _py_value(value: Any, quote: str, separators: tuple[str, str] = (",", ":")) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        body = json.dumps(value, ensure_ascii=False)[1:-1]
        if quote == "'":
            body = body.replace('\\"', '"').replace("'", "\\'")
        return f"{quote}{body}{quote}"
    return _json(value, separators)


def _json(value: Any, separators: tuple[str, str] = (",", ":")) -> str:
    return json.dumps(value, ensure_ascii=False, separators=separators)


def gemma_order(keys: Sequence[str]) -> list[str]:
    """Keys in Jinja's ``dictsort`` order (case-insensitive, stable)."""
    return sorted(keys, key=str.lower)


def gemma_value(value: Any, quote: str) -> str:
    """One value in Gemma 4's encoding (see ``Args``)."""
    if isinstance(value, str):
        return f"{quote}{value}{quote}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "{" + _gemma_items(value, quote, ",") + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(gemma_value(v, quote) for v in value) + "]"
    return str(value)


def _gemma_items(arguments: dict[str, Any], quote: str, separator: str) -> str:
    return separator.join(f"{k}:{gemma_value(arguments[k], quote)}"
                          for k in gemma_order(list(arguments)))


def tree_text(value: Any, args: Args) -> str:
    """A value as MiniMax M3's template writes it (``to_xml``): a mapping's non-null items
    and a list's items as elements, ``true``/``false``, anything else as Python prints it."""
    if isinstance(value, dict):
        return "".join(f"{args.key_open}{k}{args.key_close}{tree_text(v, args)}"
                       f"{args.value_close}</{k}>" for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(f"{args.key_open}item{args.key_close}{tree_text(v, args)}"
                       f"{args.value_close}</item>" for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def json_tag(value: Any) -> str:
    """A value's JSON type as Kimi K3's ``type=`` writes it (integers are numbers)."""
    return ("boolean" if isinstance(value, bool) else "null" if value is None else
            "number" if isinstance(value, int | float) else "string" if isinstance(value, str)
            else "object" if isinstance(value, dict) else "array")


def render_args(args: Args, arguments: dict[str, Any],
                separators: tuple[str, str] = (",", ":"),
                indent: tuple[int, int] | None = None) -> str:
    """Arguments in the dialect's encoding (strings raw in XML), JSON with ``separators``
    (the dialect's ``json_separators``), or indented as ``indent`` says (``json_indent``)."""
    if args.kind == "json" and indent is not None:
        text = json.dumps(arguments, ensure_ascii=False, indent=indent[0])
        return text.replace("\n", "\n" + " " * indent[1])
    if args.kind == "json":
        return _json(arguments, separators)
    if args.kind == "gemma":
        return _gemma_items(arguments, args.quote, args.separator)
    if args.kind == "tree":
        return tree_text(arguments, args)
    if args.kind == "python":
        return args.separator.join(f"{k}={_py_value(v, args.quote, separators)}"
                                   for k, v in arguments.items())
    parts = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else _json(value, separators)
        close = args.key_close_json.replace("{type}", json_tag(value)) \
            if args.key_close_json and not isinstance(value, str) else args.key_close
        parts.append(f"{args.key_open}{key}{close}{text}{args.value_close}")
    return "".join(parts)


def render_call(dialect: Dialect, call: ToolCall, index: int) -> str:
    """One call as the family writes it."""
    out = []
    for piece in dialect.call:
        if isinstance(piece, str):
            out.append(piece)
        elif piece is NAME:
            out.append(call.name)
        elif piece is ID:
            out.append(dialect.history_id(call.id) if dialect.ids == "alnum9" else str(index)
                       if dialect.ids == "index" else call.id)
        elif piece is INDEX:
            out.append(str(index + dialect.first_index))
        else:
            out.append(render_args(dialect.args, call.arguments, dialect.json_separators,
                                   dialect.json_indent))
    return "".join(out)


def render_calls(dialect: Dialect, calls: Sequence[ToolCall]) -> str:
    """A turn's calls as the family writes them (section, separators included)."""
    body = dialect.separator.join(render_call(dialect, c, i) for i, c in enumerate(calls))
    if dialect.section:
        return dialect.section[0] + body + dialect.section[1]
    return body


# ------------------------------------------------------------------ the families
def _json_call(open_: str, close: str, *, name_field: str = "name",
               args_field: str = "arguments") -> tuple[Piece, ...]:
    return (f'{open_}{{"{name_field}": "', NAME, f'", "{args_field}": ', ARGS, f"}}{close}")


HERMES = Dialect(
    "hermes", _json_call("<tool_call>\n", "\n</tool_call>"), separator="\n",
    families=("Hermes 2 Pro", "Hermes 3", "Qwen2.5", "Qwen3", "QwQ", "Granite 4", "SmolLM3"))
QWEN3_XML = Dialect(
    "qwen3-xml", ("<tool_call>\n<function=", NAME, ">\n", ARGS, "</function>\n</tool_call>"),
    separator="\n", args=Args("xml", "<parameter=", ">\n", "\n</parameter>\n"),
    families=("Qwen3-Coder", "Qwen3.5", "Nemotron 3 Nano", "StepFun 3.5"))
LLAMA3_JSON = Dialect(
    "llama3-json", ('{"name": "', NAME, '", "parameters": ', ARGS, "}"), max_calls=1,
    stops=("<|eom_id|>",), families=("Llama 3.1", "Llama 3.2", "Llama 3.3"))
LLAMA4_JSON = Dialect(
    "llama4-json", ('{"name": "', NAME, '", "parameters": ', ARGS, "}"),
    section=("<|python_start|><|python_end|>", ""), families=("Llama 4",))
LLAMA4_PYTHONIC = Dialect(
    "llama4-pythonic", (NAME, "(", ARGS, ")"), section=("[", "]"), separator=", ",
    args=Args("python", separator=", ", quote='"'), families=("Llama 4 (pythonic)",))
MISTRAL_V3 = Dialect(
    "mistral-v3", ('{"name": "', NAME, '", "arguments": ', ARGS, ', "id": "', ID, '"}'),
    section=("[TOOL_CALLS][", "]"), separator=", ", ids="alnum9",
    families=("Mistral 7B v0.3", "Mistral Nemo", "Mistral Large 2407"))
MISTRAL_V11_IDS = Dialect(
    "mistral-v11-ids", ("[TOOL_CALLS]", NAME, "[CALL_ID]", ID, "[ARGS]", ARGS),
    ids="alnum9", families=("Mistral Small 3.2",))
MISTRAL_V11 = Dialect(
    "mistral-v11", ("[TOOL_CALLS]", NAME, "[ARGS]", ARGS),
    families=("Devstral", "Ministral 3", "Magistral"))
HARMONY = Dialect(
    "harmony", (" to=functions.", NAME, "<|channel|>commentary json<|message|>", ARGS,
                "<|call|>"),
    max_calls=1, text_open="<|channel|>final<|message|>", stops=("<|call|>",),
    families=("gpt-oss",))
DEEPSEEK_R1 = Dialect(
    "deepseek-r1", ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>", NAME,  # noqa: RUF001
                    "\n```json\n", ARGS, "\n```<｜tool▁call▁end｜>"),  # noqa: RUF001
    section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),  # noqa: RUF001
    separator="\n", families=("DeepSeek R1", "DeepSeek V3", "R1 distills"),
    # The Hub template renders stored calls only when content is None, which
    # transformers' normalisation never passes: known by its markup, calls go into content.
    signature=("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "```json"))  # noqa: RUF001
DEEPSEEK_V31 = Dialect(
    "deepseek-v3.1", ("<｜tool▁call▁begin｜>", NAME, "<｜tool▁sep｜>", ARGS,  # noqa: RUF001
                      "<｜tool▁call▁end｜>"),  # noqa: RUF001
    section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),  # noqa: RUF001
    families=("DeepSeek V3.1",))
COMMAND_R7B = Dialect(
    "command-r7b", ('{"tool_call_id": "', ID, '", "tool_name": "', NAME,
                    '", "parameters": ', ARGS, "}"),
    section=("<|START_ACTION|>[\n    ", "\n]<|END_ACTION|>"), separator=",\n    ",
    ids="index", text_open="<|START_RESPONSE|>", text_close="<|END_RESPONSE|>",
    families=("Command R7B",))
GRANITE3 = Dialect(
    "granite-3", _json_call("", ""), section=("<|tool_call|>[", "]"), separator=", ",
    renders_calls=False, signature=("<|tool_call|>", "available_tools"),
    families=("Granite 3.x",))
FUNCTIONARY_V31 = Dialect(
    "functionary-v3.1", ("<function=", NAME, ">", ARGS, "</function>"),
    stops=("<|eom_id|>",), families=("Functionary v3.1",))
FUNCTIONARY_V32 = Dialect(
    "functionary-v3.2", (NAME, "\n", ARGS), separator="\n>>>", text_open="all\n",
    args_as="string", families=("Functionary v3.2",))
KIMI_K2 = Dialect(
    "kimi-k2", ("<|tool_call_begin|>functions.", NAME, ":", INDEX,
                "<|tool_call_argument_begin|>", ARGS, "<|tool_call_end|>"),
    section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"), ids="kimi",
    families=("Kimi K2",))
GLM45 = Dialect(
    "glm-4.5", ("<tool_call>", NAME, "\n", ARGS, "</tool_call>"), separator="\n",
    args=Args("xml", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n"),
    stops=("<|observation|>",), families=("GLM-4.5", "GLM-4.6"))
MINIMAX_M2 = Dialect(
    "minimax-m2", ('<invoke name="', NAME, '">\n', ARGS, "</invoke>\n"),
    section=("<minimax:tool_call>\n", "</minimax:tool_call>"),
    args=Args("xml", '<parameter name="', '">', "</parameter>\n"), families=("MiniMax-M2",))
SEED_OSS = Dialect(
    "seed-oss", ("<seed:tool_call>\n<function=", NAME, ">\n", ARGS,
                 "</function>\n</seed:tool_call>"), separator="\n",
    args=Args("xml", "<parameter=", ">", "</parameter>\n"), families=("Seed-OSS",))
NEMOTRON_V2 = Dialect(
    "nemotron-v2", _json_call("", ""), section=("<TOOLCALL>[", "]</TOOLCALL>"),
    separator=", ", families=("Nemotron Nano v2",))
PHI4_MINI = Dialect(
    "phi-4-mini", _json_call("", ""), section=("<|tool_call|>[", "]<|/tool_call|>"),
    separator=", ", renders_calls=False, signature=("<|tool|>", "<|/tool|>"),
    families=("Phi-4-mini",))
APERTUS = Dialect(
    "apertus", ('{"', NAME, '": ', ARGS, "}"), section=("<|tools_prefix|>[", "]<|tools_suffix|>"),
    separator=", ", families=("Apertus",))
LFM2 = Dialect(
    "lfm2", (NAME, "(", ARGS, ")"), section=("<|tool_call_start|>[", "]<|tool_call_end|>"),
    separator=", ", args=Args("python", separator=", ", quote="'"),
    families=("LFM2.5",))
LFM2_CONTENT = Dialect(
    "lfm2-content", LFM2.call, section=LFM2.section, separator=LFM2.separator, args=LFM2.args,
    renders_calls=False, signature=("<|tool_list_start|>",), families=("LFM2",))
LFM2_LIST = Dialect(
    "lfm2-list", LFM2.call, section=LFM2.section, separator=LFM2.separator, args=LFM2.args,
    renders_calls=False, signature=("List of tools: [",), families=("LFM2.5-Instruct",))
DEEPSEEK_V32 = Dialect(
    "deepseek-v3.2", ('<｜DSML｜invoke name="', NAME, '">\n', ARGS,  # noqa: RUF001
                      "</｜DSML｜invoke>\n"),  # noqa: RUF001
    section=("<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>"),  # noqa: RUF001
    args=Args("xml", '<｜DSML｜parameter name="', '" string="true">',  # noqa: RUF001
              "</｜DSML｜parameter>\n", key_close_json='" string="false">'),  # noqa: RUF001
    families=("DeepSeek V3.2",))
DEEPSEEK_V4 = Dialect(
    "deepseek-v4", DEEPSEEK_V32.call,
    section=("<｜DSML｜tool_calls>\n", "</｜DSML｜tool_calls>"),  # noqa: RUF001
    args=DEEPSEEK_V32.args, families=("DeepSeek V4",))
GEMMA4 = Dialect(
    "gemma-4", ("<|tool_call>call:", NAME, "{", ARGS, "}<tool_call|>"),
    args=Args("gemma", separator=",", quote='<|"|>'), stops=("<|tool_response>",),
    families=("Gemma 4",))

ATEM = Dialect(
    "atem", (" to=", NAME, '<|message|><atem:function_calls>\n<atem:invoke name="', NAME,
             '">\n', ARGS, "</atem:invoke>\n</atem:function_calls>"),
    separator="<|eom|><|start|>assistant",
    args=Args("xml", '<atem:parameter name="', '">', "</atem:parameter>\n"),
    text_open=" to=user<|message|>", stops=("<|eot|>",), families=("Muse Glimmer",))
"""Harmony-like: each message names its recipient (``to=self`` reasoning, ``to=user``
text, ``to=TOOL`` a call in ATEM's XML), one message per call."""

KIMI_K3 = Dialect(
    "kimi-k3", ('<|open|>call tool="', NAME, '" index="', INDEX, '"<|sep|>', ARGS,
                "<|close|>call<|sep|>"),
    section=("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>",
             "<|close|>tools<|sep|>"),
    args=Args("xml", '<|open|>argument key="', '" type="string"<|sep|>',
              "<|close|>argument<|sep|>", key_close_json='" type="{type}"<|sep|>'),
    text_open="<|open|>response<|sep|>", text_close="<|close|>response<|sep|>",
    first_index=1, families=("Kimi K3",))
"""XTML: every turn has a response block (empty before calls-only), then the calls' tools
block; each argument's key says its value's JSON type, a string raw, any other JSON."""

_MM = "]<]minimax[>["
MINIMAX_M3 = Dialect(
    "minimax-m3", (_MM, '<invoke name="', NAME, '">', ARGS, _MM, "</invoke>\n"),
    section=(_MM + "<tool_call>\n", _MM + "</tool_call>"),
    args=Args("tree", key_open=_MM + "<", key_close=">", value_close=_MM),
    families=("MiniMax M3",))
"""Every element's tag after MiniMax M3's ``]<]minimax[>[`` marker; values nested as XML."""

COMMAND_R_PLUS = Dialect(
    "command-r-plus", ('    {\n        "tool_name": "', NAME, '",\n        "parameters": ', ARGS,
                       "\n    }"),
    section=("Action:\n```json\n[\n", "\n]```"), separator=",\n", json_indent=(4, 8),
    families=("Command R+ (tool use)",))
"""Command R+'s tool-use template: an ``Action:`` block of indented JSON after any text."""

GENERIC = Dialect(
    "generic", ('{"name": "', NAME, '", "arguments": ', ARGS, "}"),
    section=('{"tool_calls": [', "]}"), separator=", ", text_open='{"response": ',
    text_close="}", text_json=True, renders_calls=False, json_separators=(", ", ": "),
    families=("any template without tool syntax (llama-server's generic format)",))
"""The fallback for a template with no tool syntax: the tools are described in the system
turn (:func:`.detect.generic_messages`), a reply is one JSON object, ``{"tool_calls": [...]}``
or ``{"response": "..."}``, and the history carries calls and results as that JSON."""

DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    HERMES, QWEN3_XML, LLAMA3_JSON, LLAMA4_JSON, LLAMA4_PYTHONIC, MISTRAL_V3, MISTRAL_V11_IDS,
    MISTRAL_V11, HARMONY, DEEPSEEK_R1, DEEPSEEK_V31, COMMAND_R7B, GRANITE3, FUNCTIONARY_V31,
    FUNCTIONARY_V32, KIMI_K2, GLM45, MINIMAX_M2, SEED_OSS, NEMOTRON_V2, PHI4_MINI, APERTUS,
    LFM2, LFM2_CONTENT, LFM2_LIST, DEEPSEEK_V32, DEEPSEEK_V4, GEMMA4, ATEM, KIMI_K3,
    COMMAND_R_PLUS, MINIMAX_M3, GENERIC)}
"""Every dialect chatkit writes, by name (``tool_format=`` takes these names)."""
