"""Tiny random-weight GGUF models that carry a real model family's vocabulary.

The tests otherwise run every tool-call dialect on SmolLM2's vocabulary, where a family's
markers (``<tool_call>``, ``<|python_tag|>``, ``[TOOL_CALLS]`` ...) are plain text.
:func:`tiny_model` writes a 2-layer ``llama`` model (n_embd 32, seeded random weights, 3-33
MB, most of it the f16 embedding) whose tokenizer is a family's own: tokens, merges, scores,
token types and pre-tokenizer read from llama.cpp's vocabulary-only GGUF
(``models/ggml-vocab-*.gguf``) inside llama-cpp-python's sdist, which ``python3 dev.py``
keeps (``dev.sdist_dir()``; MIT). Nothing is downloaded here: a missing sdist is
``FileNotFoundError`` naming the set-up command.

Those vocabulary files are the *base* models' tables: Llama 3's reserved tokens, Qwen2's
``[PAD…]`` rows, Command R's spare rows. A family adds its chat model's tokens on top
(:attr:`Family.tokens`), with the token type llama.cpp's converter gives them
(``CONTROL`` for special or ``<|…|>``-looking tokens, ``USER_DEFINED`` for other added
tokens). Two kinds, told apart by :attr:`Family.released`:

- released: the ids the released chat model has over that same base table (Llama 3.1's
  ``<|eom_id|>`` 128008 and ``<|python_tag|>`` 128010; Qwen2.5/Qwen3's 151646-151668), so
  the tiny model's tokenizer is the released model's;
- placed: the family's real vocabulary is not among llama.cpp's vocabulary files (DeepSeek
  V3, Command R7B, Phi-4-mini, Mistral, gpt-oss, Kimi K2, GLM-4.5, MiniMax-M2, Seed-OSS,
  Nemotron Nano v2, Apertus, LFM2, Granite 3, Llama 4), so its marker texts, and the turn
  markup its template writes, go into spare rows of the nearest base table (or are appended
  to it): the marker is one token of the right type in a real tokenizer of that lineage, at
  an id of our choosing. Where the base table carries another family's end-of-turn text
  (Llama 3's ``<|eot_id|>``, Qwen's ``<|im_end|>``, which llama.cpp would take as the EOT),
  :attr:`Family.eot` names the family's own.

Built once per family and cached under ``$CHATKIT_TINY_DIR`` (else ``~/.cache/chatkit/tiny``)
as ``<name>-<hash>.gguf``, written atomically; the hash covers this module's source, the
family's chat template and the sdist, so any change rebuilds.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tarfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType, TokenType
from numpy.typing import NDArray

from tests.helpers import load_dev

ROOT = Path(__file__).resolve().parent.parent
CORPORA = Path(__file__).resolve().parent / "corpora"
VOCAB_MEMBER = "vendor/llama.cpp/models/ggml-vocab-{}.gguf"

CONTROL, USER_DEFINED = TokenType.CONTROL, TokenType.USER_DEFINED
APPEND = -1
"""A :attr:`Family.tokens` id: append the token after the base table."""

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_CTX = 32, 4, 2, 64, 2, 8192


@dataclass(frozen=True)
class Family:
    """One tiny model: a base vocabulary, the chat model's tokens over it, its template."""

    name: str
    vocab: str
    """llama.cpp's vocabulary file: ``ggml-vocab-<vocab>.gguf``."""
    template: str
    """The family's chat template, a file stem under tests/corpora/*/templates (written into
    the GGUF as ``tokenizer.chat_template``)."""
    markers: tuple[str, ...]
    """The family's markup that its tokenizer has as one token each (checked by the tests)."""
    tokens: tuple[tuple[int, str, TokenType], ...] = ()
    """(id, text, type) set over the base table; id ``APPEND`` appends."""
    eos: str | None = None
    """The EOS token's text, where the chat model's differs from the base table's."""
    eot: str | None = None
    """The end-of-turn token's text, written as the GGUF's EOT where llama.cpp would
    otherwise guess another family's from the base table's texts."""
    released: bool = True
    """Whether ``tokens`` are the released chat model's ids (module docstring)."""


def _qwen_tokens() -> tuple[tuple[int, str, TokenType], ...]:
    """Qwen2.5's added tokens (151646-151664) and Qwen3's (151665-151668), as in their
    tokenizer_config.json; ``special: false`` ones that do not look like ``<|…|>`` are
    USER_DEFINED in llama.cpp's conversion."""
    texts = ["<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
             "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
             "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
             "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
             "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
             "</think>"]
    return tuple((151646 + i, t, CONTROL if t.startswith("<|") else USER_DEFINED)
                 for i, t in enumerate(texts))


def _rows(first: int, texts: list[str], kind: TokenType = CONTROL,
          ) -> tuple[tuple[int, str, TokenType], ...]:
    """``texts`` in consecutive rows from ``first`` (``APPEND``: appended in order)."""
    return tuple((first if first == APPEND else first + i, t, kind) for i, t in enumerate(texts))


def _turn_then_tool(first: int, turn: list[str], tool: list[str],
                    ) -> tuple[tuple[int, str, TokenType], ...]:
    """A family's turn markers as control rows from ``first``, its tool markers as
    user-defined rows right after them (GGUFs that keep tool markup out of CONTROL)."""
    return _rows(first, turn) + _rows(first + len(turn), tool, USER_DEFINED)


def ds(name: str) -> str:
    """DeepSeek's marker ``name`` between its fullwidth bars: ``<\uff5cname\uff5c>``."""
    return f"<\uff5c{name}\uff5c>"


_DEEPSEEK = [ds(n) for n in ("User", "Assistant", "tool▁calls▁begin", "tool▁calls▁end",
                             "tool▁call▁begin", "tool▁call▁end", "tool▁sep",
                             "tool▁outputs▁begin", "tool▁outputs▁end", "tool▁output▁begin",
                             "tool▁output▁end")]
_COHERE = ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
           "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>", "<|START_RESPONSE|>",
           "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>"]
_MISTRAL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
            "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]

# Placed rows: Llama 3's reserved special rows from 128011 (CONTROL), Qwen2's [PAD…] rows
# from 151646, StarCoder's table appended (Granite 3 is StarCoder's table plus its own rows).
_LLAMA_SPARE, _QWEN_SPARE = 128011, 151646
_HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
            "<|constrain|>", "<|startoftext|>", "<|endoftext|>", "<|endofprompt|>"]
_KIMI = ["[BOS]", "[EOS]", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
         "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|media_start|>",
         "<|media_content|>", "<|media_end|>", "<|media_pad|>"]
_KIMI_K3 = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
_GLM = ["[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
        "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
        "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
        "</arg_value>"]
_MINIMAX_TURN = ["]~!b[", "]~b]", "[e~["]
_MINIMAX_TOOL = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]
_SEED_TURN = ["<seed:bos>", "<seed:pad>", "<seed:eos>"]
_SEED_TOOL = ["<seed:think>", "</seed:think>", "<seed:cot_budget_reflect>",
              "</seed:cot_budget_reflect>", "<seed:tool_call>", "</seed:tool_call>"]
_NEMOTRON_TURN = ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"]
_NEMOTRON_TOOL = ["<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>",
                  "</TOOL_RESPONSE>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>"]
_APERTUS = ["<|system_start|>", "<|system_end|>", "<|developer_start|>", "<|developer_end|>",
            "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
            "<|inner_prefix|>", "<|inner_suffix|>", "<|tools_prefix|>", "<|tools_suffix|>"]
_LFM2 = ["<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
         "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"]
_GRANITE = ["<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>", "<|start_of_cite|>",
            "<|end_of_cite|>", "<|start_of_plugin|>", "<|end_of_plugin|>"]
_ATEM = ["<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "<|patch|>", "<|video|>"]
_LLAMA4 = ["<|header_start|>", "<|header_end|>", "<|eom|>", "<|eot|>", "<|python_start|>",
           "<|python_end|>", "<|image|>", "<|image_start|>", "<|image_end|>", "<|patch|>"]

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama-3.1", "llama-bpe", "llama-3.1-instruct",
           ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|begin_of_text|>"),
           tokens=((128004, "<|finetune_right_pad_id|>", CONTROL),
                   (128008, "<|eom_id|>", CONTROL), (128010, "<|python_tag|>", CONTROL)),
           eos="<|eot_id|>"),
    Family("qwen3", "qwen2", "qwen3",
           ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
            "<|im_start|>", "<|im_end|>"),
           tokens=_qwen_tokens(), eos="<|im_end|>"),
    Family("deepseek-r1", "deepseek-llm", "deepseek-r1",
           (*(ds(n) for n in ("tool▁calls▁begin", "tool▁call▁begin", "tool▁sep",
                              "tool▁call▁end", "tool▁calls▁end", "Assistant",
                              "end▁of▁sentence")), "<think>", "</think>"),
           tokens=(*_rows(100015, _DEEPSEEK),
                   *_rows(100015 + len(_DEEPSEEK), ["<think>", "</think>"], USER_DEFINED)),
           released=False),
    Family("command-r7b", "command-r", "command-r7b",
           ("<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>", "<|START_THINKING|>",
            "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|CHATBOT_TOKEN|>"),
           tokens=_rows(255029, _COHERE), released=False),
    Family("phi-4-mini", "phi-3", "phi-4-mini-instruct",
           ("<|tool_call|>", "<|/tool_call|>", "<|end|>", "<|assistant|>", "<|user|>"),
           # Phi-3's own placeholder rows (CONTROL already) take Phi-4-mini's tool markers
           tokens=_rows(32002, ["<|tool_call|>", "<|/tool_call|>", "<|tool|>", "<|/tool|>"])
           + _rows(32008, ["<|tool_response|>", "<|tag|>"]),
           released=False),
    Family("mistral", "llama-spm", "mistral-small-3.2-instruct-2506",
           ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[INST]", "[/INST]", "</s>"),
           tokens=_rows(APPEND, _MISTRAL), released=False),
    Family("gemma-4", "gemma-4", "gemma-4-it",
           ("<|tool_call>", "<tool_call|>", "<|turn>", "<turn|>", "<|channel>",
            "<channel|>", '<|"|>')),
    # o200k_harmony is a tiktoken BPE as Llama 3's is; its specials are all control tokens
    Family("gpt-oss", "llama-bpe", "gpt-oss",
           ("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|end|>", "<|return|>",
            "<|constrain|>"),
           tokens=_rows(_LLAMA_SPARE, _HARMONY), eos="<|return|>", eot="<|end|>",
           released=False),
    Family("kimi-k2", "qwen2", "kimi-k2",
           ("<|tool_calls_section_begin|>", "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>",
            "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "<|im_user|>"),
           tokens=_rows(_QWEN_SPARE, _KIMI), eos="<|im_end|>", released=False),
    # MiniMax M3's element marker and turn markers, placed as control tokens (its think tags
    # user-defined, as M2's)
    Family("minimax-m3", "qwen2", "minimax-m3", ("]<]minimax[>[", "]~b]", "[e~[", "<mm:think>",
                                                 "</mm:think>"),
           tokens=_rows(_QWEN_SPARE, ["]~!b[", "]~b]", "[e~[", "]<]minimax[>["])
           + _rows(_QWEN_SPARE + 4, ["<mm:think>", "</mm:think>"], USER_DEFINED),
           eos="[e~[", eot="[e~[", released=False),
    # Kimi K3's XTML markers are not in K2's released table: placed as control tokens
    Family("kimi-k3", "qwen2", "kimi-k3", ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"),
           tokens=_rows(_QWEN_SPARE, _KIMI_K3), eos="<|end_of_msg|>", eot="<|end_of_msg|>",
           released=False),
    # GLM-4.5's added tokens are all special (CONTROL), its tool markup included
    Family("glm-4.5", "qwen2", "glm-4.6",
           ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
            "</arg_value>", "<think>", "</think>", "<|assistant|>", "<|user|>",
            "<|observation|>", "[gMASK]", "<sop>"),
           tokens=_rows(_QWEN_SPARE, _GLM), eot="<|user|>", released=False),
    Family("minimax-m2", "qwen2", "minimax-m2",
           ("<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>", "]~!b[",
            "]~b]", "[e~["),
           tokens=_turn_then_tool(_QWEN_SPARE, _MINIMAX_TURN, _MINIMAX_TOOL),
           eos="[e~[", eot="[e~[", released=False),
    Family("seed-oss", "qwen2", "seed-oss",
           ("<seed:tool_call>", "</seed:tool_call>", "<seed:think>", "</seed:think>",
            "<seed:bos>", "<seed:eos>"),
           tokens=_turn_then_tool(_QWEN_SPARE, _SEED_TURN, _SEED_TOOL),
           eos="<seed:eos>", eot="<seed:eos>", released=False),
    Family("nemotron-v2", "llama-bpe", "nemotron-nano-v2",
           ("<TOOLCALL>", "</TOOLCALL>", "<think>", "</think>", "<SPECIAL_10>",
            "<SPECIAL_11>", "<SPECIAL_12>"),
           tokens=_turn_then_tool(_LLAMA_SPARE, _NEMOTRON_TURN, _NEMOTRON_TOOL),
           eos="<SPECIAL_12>", eot="<SPECIAL_12>", released=False),
    Family("apertus", "llama-bpe", "apertus",
           ("<|tools_prefix|>", "<|tools_suffix|>", "<|assistant_start|>",
            "<|assistant_end|>", "<|user_start|>", "<|user_end|>"),
           tokens=_rows(_LLAMA_SPARE, _APERTUS), eos="<|assistant_end|>",
           eot="<|assistant_end|>", released=False),
    # one vocabulary for LFM2 (calls in content) and LFM2.5 (calls rendered)
    Family("lfm2", "qwen2", "lfm2.5",
           ("<|tool_call_start|>", "<|tool_call_end|>", "<|im_start|>", "<|im_end|>",
            "<think>", "</think>"),
           tokens=_turn_then_tool(_QWEN_SPARE, _LFM2, ["<think>", "</think>"]),
           eos="<|im_end|>", released=False),
    Family("granite-3", "starcoder", "granite-3.3",
           ("<|tool_call|>", "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
           tokens=((0, "<|end_of_text|>", CONTROL), *_rows(APPEND, _GRANITE)),
           eos="<|end_of_text|>", eot="<|end_of_text|>", released=False),
    Family("llama-4", "llama-bpe", "llama-4",
           ("<|python_start|>", "<|python_end|>", "<|header_start|>", "<|header_end|>",
            "<|eot|>", "<|begin_of_text|>"),
           tokens=_rows(_LLAMA_SPARE, _LLAMA4), eos="<|eot|>", eot="<|eot|>", released=False),
    # Muse Glimmer's ATEM: harmony-like recipients; its tokenizer is not public, so its turn
    # markers are placed as control tokens over Llama 3's table (its XML tags stay text)
    Family("muse-glimmer", "llama-bpe", "muse-glimmer",
           ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>"),
           tokens=_rows(_LLAMA_SPARE, _ATEM), eos="<|eot|>", eot="<|eot|>", released=False),
]}


def sdist_path() -> Path:
    """llama-cpp-python's sdist as ``python3 dev.py`` keeps it (``CHATKIT_SDIST_DIR`` moves
    it); ``FileNotFoundError`` naming the set-up command when it is not there."""
    dev = load_dev()
    path: Path = Path(dev.sdist_dir()) / str(dev.LLAMA_SDIST)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run python3 dev.py setup (it downloads "
                                "llama-cpp-python's sdist once)")
    return path


def tiny_dir() -> Path:
    """Where built tiny models are kept: ``$CHATKIT_TINY_DIR``, else ``~/.cache/chatkit/tiny``."""
    return Path(os.environ.get("CHATKIT_TINY_DIR") or Path.home() / ".cache" / "chatkit" / "tiny")


def template_text(family: Family) -> str:
    """The family's chat template from tests/corpora."""
    return next(CORPORA.glob(f"*/templates/{family.template}.jinja")).read_text()


@functools.lru_cache(maxsize=4)
def vocab_bytes(vocab: str, sdist: Path) -> bytes:
    """``ggml-vocab-<vocab>.gguf`` read from the sdist tarball (one pass up to the member;
    ``KeyError`` when the sdist has no such file). The last few are kept: families share
    base tables."""
    suffix = "/" + VOCAB_MEMBER.format(vocab)
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if member.name.endswith(suffix) and member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read()
    raise KeyError(f"{sdist.name} has no {VOCAB_MEMBER.format(vocab)}")


def _key(family: Family, sdist: Path) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(template_text(family).encode())
    h.update(f"{family.name}|{sdist.name}|{sdist.stat().st_size}|{version('gguf')}".encode())
    return h.hexdigest()[:16]


def tiny_model(name: str) -> Path:
    """The tiny GGUF of family ``name`` (a key of :data:`FAMILIES`), built once and cached.

    Deterministic: the same sdist and module give the same bytes. Raises ``KeyError`` for an
    unknown family and ``FileNotFoundError`` when the sdist is missing (:func:`sdist_path`).
    """
    family = FAMILIES[name]
    sdist = sdist_path()
    path = tiny_dir() / f"{family.name}-{_key(family, sdist)}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        _write(family, vocab_bytes(family.vocab, sdist), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- reading
KV = dict[str, tuple[object, GGUFValueType, "GGUFValueType | None"]]
"""GGUF key-value pairs: key -> (value, type, array element type); strings as raw bytes."""

_SCALARS = {t: np.dtype(d).newbyteorder("<") for t, d in gguf.GGUFReader.gguf_scalar_to_np.items()}


def read_kv(raw: bytes) -> KV:
    """The key-value pairs of the GGUF file ``raw`` (version 2 or 3, little-endian).

    gguf's own ``GGUFReader`` makes a numpy view per string: 5-13 s for one of these
    vocabularies (hundreds of thousands of tokens and merges), most of a first test run;
    this reads the same section in well under a second (``ValueError`` on a file that is
    not GGUF)."""
    view = memoryview(raw)
    if raw[:4] != b"GGUF" or int.from_bytes(raw[4:8], "little") not in (2, 3):
        raise ValueError("not a little-endian GGUF v2/v3 file")
    n_kv = int.from_bytes(raw[16:24], "little")
    pos = 24

    def u64() -> int:
        nonlocal pos
        pos += 8
        return int.from_bytes(view[pos - 8:pos], "little")

    def string() -> bytes:
        nonlocal pos
        n = u64()
        pos += n
        return bytes(view[pos - n:pos])

    def value(kind: GGUFValueType) -> object:
        nonlocal pos
        if kind == GGUFValueType.STRING:
            return string()
        dtype = _SCALARS[kind]
        pos += dtype.itemsize
        return np.frombuffer(view[pos - dtype.itemsize:pos], dtype=dtype)[0].item()

    kv: KV = {}
    for _ in range(n_kv):
        key = string().decode()
        kind = GGUFValueType(int.from_bytes(view[pos:pos + 4], "little"))
        pos += 4
        if kind != GGUFValueType.ARRAY:
            kv[key] = value(kind), kind, None
            continue
        sub = GGUFValueType(int.from_bytes(view[pos:pos + 4], "little"))
        pos += 4
        count = u64()
        if sub == GGUFValueType.STRING:
            kv[key] = [string() for _ in range(count)], kind, sub
        elif sub in _SCALARS:
            dtype = _SCALARS[sub]
            size = dtype.itemsize * count
            kv[key] = np.frombuffer(view[pos:pos + size], dtype=dtype).tolist(), kind, sub
            pos += size
        else:
            raise ValueError(f"{key}: arrays of {sub.name} are not read here")
    return kv


# --------------------------------------------------------------------------- writing
def _tokenizer_kv(family: Family, raw: bytes) -> KV:
    """The vocabulary file's ``tokenizer.*`` pairs, the family's tokens set over them, its
    template as the chat template."""
    kv = {k: v for k, v in read_kv(raw).items()
          if k.startswith("tokenizer.") and not k.startswith("tokenizer.chat_template")}
    kv.pop("tokenizer.chat_templates", None)
    texts: list[bytes] = list(kv["tokenizer.ggml.tokens"][0])  # type: ignore[call-overload]
    types: list[int] = list(kv["tokenizer.ggml.token_type"][0])  # type: ignore[call-overload]
    scores = kv.get("tokenizer.ggml.scores")
    score_list: list[float] | None = list(scores[0]) if scores else None  # type: ignore[call-overload]
    for tid, text, kind in family.tokens:
        if tid == APPEND:
            texts.append(text.encode())
            types.append(int(kind))
            if score_list is not None:
                score_list.append(0.0)
        else:
            texts[tid] = text.encode()
            types[tid] = int(kind)
    kv["tokenizer.ggml.tokens"] = texts, GGUFValueType.ARRAY, GGUFValueType.STRING
    kv["tokenizer.ggml.token_type"] = types, GGUFValueType.ARRAY, GGUFValueType.INT32
    if score_list is not None:
        kv["tokenizer.ggml.scores"] = score_list, GGUFValueType.ARRAY, GGUFValueType.FLOAT32
    for key, special in (("eos", family.eos), ("eot", family.eot)):
        if special is not None:
            kv[f"tokenizer.ggml.{key}_token_id"] = (texts.index(special.encode()),
                                                    GGUFValueType.UINT32, None)
    kv["tokenizer.chat_template"] = template_text(family), GGUFValueType.STRING, None
    return kv


def _write(family: Family, raw: bytes, out: Path) -> None:
    """Write the tiny model of ``family`` (vocabulary file bytes ``raw``) to ``out``."""
    kv = _tokenizer_kv(family, raw)
    n_vocab = len(kv["tokenizer.ggml.tokens"][0])  # type: ignore[arg-type]
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(family.name.encode()).digest()[:8],
                                               "little"))
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(f"tiny-{family.name}")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    for key, (value, kind, sub) in kv.items():
        writer.add_key_value(key, value, kind, sub_type=sub)

    def weight(*shape: int, dtype: type[np.floating[Any]] = np.float32) -> NDArray[Any]:
        """Seeded normal weights, scaled by 1/sqrt(fan-in)."""
        values: NDArray[Any] = rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])
        return values.astype(dtype)

    head = N_EMBD // N_HEAD
    # the output projection is tied to the embedding (no output.weight), f16 to stay small
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD, dtype=np.float16) * 8)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    for i in range(N_LAYER):
        blk = f"blk.{i}."
        writer.add_tensor(blk + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(blk + "attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(blk + "attn_k.weight", weight(N_HEAD_KV * head, N_EMBD))
        writer.add_tensor(blk + "attn_v.weight", weight(N_HEAD_KV * head, N_EMBD))
        writer.add_tensor(blk + "attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(blk + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(blk + "ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(blk + "ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(blk + "ffn_down.weight", weight(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
