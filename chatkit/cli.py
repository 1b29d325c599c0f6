"""The ``chatkit`` command: the subprocess interface for verdict lanes.

    chatkit run --prompt TEXT|@FILE|- [--json-schema JSON|@FILE | --lark G|@FILE | --regex P]
                [--model PATH] [--system TEXT|@FILE] [--no-think] [--max-tokens N]
                [--temperature T] [--top-p P] [--seed N] [--stop STR ...] [--speculative]
                [--threads N] [--json] [--debug]
    chatkit serve [--model PATH] [--host H] [--port N] [--api-key KEY] [--n-ctx N]
                  [--n-seq-max N] [--cache-seqs N] [--max-queue N] [--threads N] [--name NAME]
    chatkit info [--model PATH]

Every answer parses, or the command fails by name: one line on stderr,
``chatkit: <ErrorName>: <details>``, and the error's own exit code
(``ChatkitError.exit_code``; usage errors exit 2). Constraint refusals happen
before the model is loaded. Nothing but the answer goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import ChatkitError, GrammarInvalid, InvalidParameter, SchemaInvalid, UsageError
from .serve.sizing import POOL_MAX_CTX_PER_SEQ, KVLayout, flash_attn

if TYPE_CHECKING:
    from .grammar.constraints import Constraint
    from .templates import ChatTemplate

__all__: list[str] = []

USAGE_EXIT = UsageError.exit_code
"""The exit status of a command line the ``chatkit`` command refuses."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _read_arg(value: str, *, what: str, error: type[Exception]) -> str:
    """``@path`` reads a file, ``-`` reads stdin (for the prompt), anything else is inline."""
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise _make(error, what, f"cannot read {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise _make(error, what, f"{path} is not UTF-8 text: {exc.reason} at byte "
                        f"{exc.start}") from None
    return value


def _make(error: type[Exception], what: str, message: str) -> Exception:
    if error is GrammarInvalid:
        return GrammarInvalid(what, message)
    if error is SchemaInvalid:
        return SchemaInvalid(message)
    return UsageError(f"{what}: {message}")


def _looks_like_path(value: str) -> bool:
    v = value.strip()
    if not v or "\n" in v or v.startswith(("{", "[")):
        return False
    return _is_file(v) or v.endswith((".json", ".lark", ".txt", ".regex"))


def _is_file(value: str) -> bool:
    try:
        return Path(value).is_file()
    except (OSError, ValueError):  # too long a name, a NUL byte: not a file
        return False


def _constraint(args: argparse.Namespace) -> Constraint | None:
    """Build (and so check) the constraint before anything touches the model."""
    from .grammar.constraints import Constraint

    if args.json_schema is not None:
        raw = _read_arg(args.json_schema, what="--json-schema", error=SchemaInvalid)
        if not args.json_schema.startswith("@") and _looks_like_path(raw):
            try:
                json.loads(raw)
            except ValueError:
                raise SchemaInvalid(f"{raw!r} is not JSON; did you mean @{raw}?") from None
        return Constraint.json_schema(raw)
    for flag, value, build in (("lark", args.lark, Constraint.lark),
                               ("regex", args.regex, Constraint.regex)):
        if value is None:
            continue
        raw = _read_arg(value, what=flag, error=GrammarInvalid)
        if not value.startswith("@") and _is_file(raw.strip()):
            raise GrammarInvalid(flag, f"{raw!r} is a file; did you mean @{raw}?")
        return build(raw)
    return None


def _check_run_flags(args: argparse.Namespace, constraint: Constraint | None) -> None:
    """Flags that do not go together are a ``UsageError`` before the model loads."""
    if constraint is not None and args.stop:
        raise UsageError("--stop ends free text; a constraint ends itself")
    if args.mcp and constraint is not None and constraint.kind != "json_schema":
        raise UsageError("--mcp answers free text or --json-schema (the agent loop's final "
                         "answer), not --regex or --lark")
    if args.stream and (constraint is None or constraint.kind != "json_schema"
                        or args.mcp or not args.json):
        raise UsageError("--stream prints a --json-schema reply's steps as JSON lines "
                         "(with --json)")
    if args.probabilities and (constraint is None or constraint.kind != "json_schema"
                               or args.mcp):
        raise UsageError("--probabilities reports a --json-schema reply's field values")
    if (args.tool_choice or args.max_steps or args.tool_call_threshold is not None
            ) and not args.mcp:
        raise UsageError("--tool-choice, --tool-call-threshold and --max-steps need --mcp "
                         "(the agent loop)")


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    prompt = _read_arg(args.prompt, what="--prompt", error=UsageError)
    if args.prompt == "-":
        prompt = sys.stdin.read()
    system = _read_arg(args.system, what="--system", error=UsageError) if args.system else None
    _apply_grammar_limits(args)
    constraint = _constraint(args)
    _check_run_flags(args, constraint)

    from .chat.conversation import Conversation
    from .decode.sampling import SamplingParams
    from .engine.model import Model

    # --probabilities branches on a second KV sequence
    model = Model.load(args.model, n_ctx=args.n_ctx, n_seq_max=2 if args.probabilities else 1,
                       n_threads=args.threads,
                       progress=_tty_progress("loading model"), **_placement(args))
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    conv = Conversation(model, system=system, no_think=args.no_think, sampling=sampling,
                        stop=args.stop or (), max_tokens=args.max_tokens)
    if args.mcp:
        reply = _run_agent(args, conv, prompt, constraint)
    elif args.stream:
        reply = _streamed(conv.stream(prompt, schema=constraint, speculative=args.speculative,
                                      probabilities=args.probabilities))
    elif constraint is not None and constraint.kind == "json_schema":
        reply = conv.send(prompt, schema=constraint, speculative=args.speculative,
                          probabilities=args.probabilities)
    else:
        reply = conv.send(prompt, constraint=constraint, speculative=args.speculative)
    if args.json:
        out = {
            "text": reply.text,
            "parsed": reply.parsed,
            "finish_reason": reply.finish_reason,
            "prompt_tokens": reply.usage.prompt_tokens,
            "completion_tokens": reply.usage.completion_tokens,
            "model": model.name,
            "seconds": round(time.perf_counter() - started, 3),
        }
        if reply.choices:
            out["choices"] = _choices_json(reply.choices)
        if args.mcp:
            out["tool_results"] = [{"name": m.name, "content": m.content}
                                   for m in conv.messages if m.role == "tool"]
        _write_json(out)
    else:
        sys.stdout.write(reply.text + "\n")
        for path, c in (reply.choices or {}).items():
            shown = ", ".join(f"{json.dumps(v)} {p:.4f}" for v, p in c.probabilities.items())
            sys.stdout.write(f"{path}: {shown}\n")
    return 0


def _streamed(stream: Any) -> Any:
    """``--stream``: one JSON line per step of the reply; the Reply."""
    for step in stream.partials():
        _write_json({"delta": step.delta, "data": step.data, "done": step.done,
                     "events": [{"kind": e.kind, "path": e.path,
                                 **({"value": e.value} if e.kind == "complete" else {})}
                                for e in step.events]})
    return stream.reply


def _write_json(out: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _choices_json(choices: dict[str, Any]) -> dict[str, Any]:
    """``--probabilities`` in ``--json`` output: per field, each value with its probability
    (a list: values need not be strings), the reply's value, the decision and its margin."""
    return {path: {"values": [{"value": v, "p": p} for v, p in c.probabilities.items()],
                   "chosen": c.chosen, "decision": c.decision, "margin": c.margin,
                   "unaccounted": c.unaccounted, "temperature": c.temperature}
            for path, c in choices.items()}


def _run_agent(args: argparse.Namespace, conv: Any, prompt: str,
               constraint: Constraint | None) -> Any:
    """The agent loop over the ``--mcp`` servers' tools; every server is stopped on the
    way out, whatever happens (an error, Ctrl-C)."""
    import contextlib
    import os

    from .tools.mcp import MCPToolset

    with contextlib.ExitStack() as stack:
        quiet = None if args.debug else stack.enter_context(open(os.devnull, "w"))
        tools: list[Any] = []
        for target in args.mcp:
            server = (MCPToolset.http(target) if target.startswith(("http://", "https://"))
                      else MCPToolset.stdio(target, stderr=quiet))
            stack.enter_context(server)
            tools += server.tools()
        options: dict[str, Any] = {"tools": tools}
        if args.tool_choice:
            options["tool_choice"] = args.tool_choice
        if args.tool_call_threshold is not None:
            options["tool_call_threshold"] = args.tool_call_threshold
        schema = constraint.source if constraint is not None else None  # the checked dict
        return conv.run(prompt, schema=schema, max_steps=args.max_steps or 8, **options)


def _tty_progress(what: str) -> Callable[[float], None] | None:
    """A progress line on stderr when it is a terminal (nothing otherwise: lanes parse it)."""
    if not sys.stderr.isatty():
        return None

    def show(fraction: float) -> None:
        end = "\n" if fraction >= 1.0 else ""
        print(f"\r{what} {fraction:4.0%}", end=end, file=sys.stderr, flush=True)

    return show


def _info(args: argparse.Namespace) -> int:
    from .engine.model import Model, build_info

    model = Model.load(args.model, n_ctx=256, n_seq_max=1, **_placement(args))
    print(f"path: {model.path}")
    print(f"n_vocab: {model.n_vocab}")
    print(f"bos/eos/eot: {model.bos_id}/{model.eos_id}/{model.eot_id}")
    print(f"chat template: {'yes' if model.chat_template else 'none'}")
    print(f"placement: {model.placement.reason}")
    for line in build_info().describe():
        print(line)
    return 0


def _placement(args: argparse.Namespace) -> dict[str, Any]:
    """Model.load's placement options from the command line (``_placement_flags``)."""
    return {"n_gpu_layers": args.n_gpu_layers, "main_gpu": args.main_gpu,
            "split_mode": args.split_mode, "tensor_split": args.tensor_split,
            "flash_attn": {None: None, "auto": None, "on": True, "off": False}[args.flash_attn],
            "offload_kqv": not args.no_offload_kqv}


def _proportions(value: str) -> list[float]:
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {value!r}"
                                         ) from None


def _layers(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (every layer) or >= 0: {value}")
    return n


SPLIT_MODES = ("layer", "none", "row", "tensor")
"""``--split-mode`` choices: ``chatkit.engine.model.SPLIT_MODES`` (not imported here: ``chatkit
--help`` does not load llama.cpp)."""


def _placement_flags(parser: argparse.ArgumentParser) -> None:
    """GPU offload options, as Model.load takes them (README, "GPU offload")."""
    parser.add_argument("--n-gpu-layers", type=_layers, default=None,
                        help="layers offloaded to the GPU (-1: every layer; default: every "
                             "layer where the build has a GPU backend, else the CPU)")
    parser.add_argument("--main-gpu", type=int, default=0, help="the GPU for --split-mode none")
    parser.add_argument("--split-mode", choices=SPLIT_MODES, default="layer",
                        help="how layers spread over several GPUs (default: layer)")
    parser.add_argument("--tensor-split", type=_proportions, default=None,
                        help="proportion per GPU, comma-separated (e.g. 3,1)")
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default=None,
                        help="flash attention (default: llama.cpp decides; chatkit serve "
                             "turns it off on the CPU with a KV stream per sequence, "
                             "docs/serving.md)")
    parser.add_argument("--no-offload-kqv", action="store_true",
                        help="keep the KV cache and attention on the CPU")


def _serve_template(args: argparse.Namespace) -> ChatTemplate | None:
    """``--chat-template`` read and compiled, ``--tool-format`` checked: before the model
    loads, so a typo costs no load."""
    from .templates import BUNDLED, ChatTemplate
    from .tools.dialects import DIALECTS

    if args.tool_format is not None and args.tool_format not in DIALECTS:
        raise UsageError(f"--tool-format {args.tool_format!r} is not one of "
                         f"{', '.join(DIALECTS)}")
    if args.chat_template is None:
        return None
    if args.chat_template in BUNDLED:
        return ChatTemplate.bundled(args.chat_template)
    path = Path(args.chat_template)
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--chat-template {path}: {exc.strerror or exc}") from None
    return ChatTemplate.from_string(source, name=path.stem)


def _serve_flash_attn(args: argparse.Namespace, layout: KVLayout,
                     ctx_per_seq: int) -> tuple[bool | None, str]:
    """``--flash-attn``, or serve's own choice for ``layout`` (``sizing.flash_attn``)."""
    from .engine.backends import plan_placement
    from .engine.gguf_header import attention_heads
    from .engine.llama_log import build_info
    from .engine.vocab import checked_gguf

    if args.flash_attn is not None:
        return flash_attn(args.flash_attn, layout=layout, ctx_per_seq=ctx_per_seq,
                          heads=None, on_gpu=False)
    where = plan_placement(build_info(), extra_buffer_types=None, **_placement(args))
    return flash_attn(None, layout=layout, ctx_per_seq=ctx_per_seq,
                      heads=attention_heads(checked_gguf(args.model)), on_gpu=where.on_gpu)


def _serve(args: argparse.Namespace) -> int:
    import logging
    import os

    try:
        from .serve.server import serve
    except ImportError as exc:
        raise UsageError(f"chatkit serve needs the serve extra (pip install 'chatkit[serve]'):"
                         f" {exc}") from None
    from .chat.scheduler import engine_loop
    from .engine.model import Model
    from .serve import sizing
    from .serve.openai_api import ServerLimits

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _apply_grammar_limits(args)
    template = _serve_template(args)
    sizing.check_flags(args.kv, reproducible=args.reproducible, cache_seqs=args.cache_seqs)
    ctx_per_seq, sized = sizing.ctx_per_seq(args.model, ctx_per_seq=args.ctx_per_seq,
                                            n_ctx=args.n_ctx, n_seq_max=args.n_seq_max)
    layout = sizing.kv_layout(args.kv, reproducible=args.reproducible,
                              cache_seqs=args.cache_seqs, ctx_per_seq=ctx_per_seq,
                              n_seq_max=args.n_seq_max)
    n_ctx = args.n_ctx if args.n_ctx is not None else args.n_seq_max * ctx_per_seq
    placement = _placement(args)
    placement["flash_attn"], flash_why = _serve_flash_attn(args, layout, ctx_per_seq)
    model = Model.load(args.model, n_ctx=n_ctx, n_seq_max=args.n_seq_max,
                       n_threads=args.threads, progress=_tty_progress("loading model"),
                       kv_unified=layout.kv_unified, cache_seqs=layout.cache_seqs,
                       swa_full=layout.swa_full, batch_invariant=layout.reproducible,
                       **placement)
    if model.kv_unified:  # one pool, but each request keeps its sequence's share of it
        model.n_ctx_seq = model.n_ctx // args.n_seq_max
    engine_loop(model).reproducible = layout.reproducible
    origin = (f"--n-ctx {args.n_ctx} shared by --n-seq-max {args.n_seq_max}"
              if args.n_ctx is not None else
              f"--ctx-per-seq {ctx_per_seq} for each of --n-seq-max {args.n_seq_max}")
    log = logging.getLogger("chatkit")
    log.info("context: %d tokens for each of %d sequences (%s)", model.n_ctx_seq,
             args.n_seq_max, sized)
    log.info("KV cache: %s", layout.why)
    log.info("flash attention: %s", flash_why)
    name = args.name or Path(str(model.path)).stem
    limits = ServerLimits(max_tokens=args.max_tokens_cap, context_source=origin,
                          speculative=args.speculative)
    serve(model, name=name, host=args.host, port=args.port,
          api_key=args.api_key or os.environ.get("CHATKIT_API_KEY") or None, limits=limits,
          max_queue=args.max_queue, template=template, tool_format=args.tool_format,
          drain_timeout=args.drain_timeout)
    return 0


def _int_at_least(value: str, low: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}: {value}")
    return n


def _positive_int(value: str) -> int:
    return _int_at_least(value, 1)


def _non_negative_int(value: str) -> int:
    return _int_at_least(value, 0)


def _seconds(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 <= n < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 and finite: {value}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chatkit", description="Chat with local GGUF models, structure "
                     "guaranteed by construction.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub)
    _add_serve(sub)
    info = sub.add_parser("info", help="describe a GGUF model and the llama.cpp build: its "
                          "backends, devices and where the layers run")
    info.add_argument("--model", default=None, help="GGUF path (default: embedded SmolLM2)")
    _placement_flags(info)
    info.add_argument("--debug", action="store_true", help="show tracebacks")
    info.set_defaults(func=_info)
    return parser


def _add_run(sub: Any) -> None:
    """The ``run`` command and its flags."""
    run = sub.add_parser("run", help="one constrained reply (the verdict-lane interface)")
    run.add_argument("--prompt", required=True, help="TEXT, @FILE, or - for stdin")
    run.add_argument("--system", help="TEXT or @FILE")
    run.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    group = run.add_mutually_exclusive_group()
    group.add_argument("--json-schema", help="JSON Schema, inline or @FILE")
    group.add_argument("--lark", help="Lark grammar (llguidance dialect), inline or @FILE")
    group.add_argument("--regex", help="regular expression the whole reply must match")
    run.add_argument("--no-think", action="store_true", help="prefill an empty think block")
    run.add_argument("--max-tokens", type=_positive_int, default=256)
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--stop", action="append", help="stop string for free text (repeatable)")
    run.add_argument("--n-ctx", type=_positive_int, default=4096, help=argparse.SUPPRESS)
    run.add_argument("--threads", type=_positive_int, default=None,
                     help="llama.cpp threads (default: every core)")
    run.add_argument("--speculative", action="store_true",
                     help="grammar-drafted speculative decoding (same output, fewer passes)")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--stream", action="store_true",
                     help="with --json-schema --json: one JSON line per step as the reply "
                     "is written (delta, data so far, fields started/completed), then the "
                     "--json object")
    run.add_argument("--probabilities", action="store_true",
                     help="with --json-schema: each enumerable field's exact value "
                     "probabilities (in --json: \"choices\")")
    run.add_argument("--mcp", action="append", metavar="COMMAND|URL",
                     help="an MCP server's tools for the agent loop: a command (started over "
                          "stdio) or an http(s) URL (streamable HTTP); repeatable")
    run.add_argument("--tool-choice", default=None,
                     help="with --mcp: auto (default), required, none, or a tool's name "
                          "(the first call only)")
    run.add_argument("--tool-call-threshold", type=float, default=None, metavar="P",
                     help="with --mcp: the probability of a call's opening at which 'auto' "
                          "calls (0: always, 1: never; default 0.004 on models without a "
                          "tool format)")
    run.add_argument("--max-steps", type=_positive_int, default=None,
                     help="with --mcp: model turns before MaxStepsExceeded (default 8)")
    _placement_flags(run)
    _grammar_limit_flag(run)
    run.add_argument("--debug", action="store_true", help="show tracebacks and MCP "
                     "servers' logs")
    run.set_defaults(func=_run)


def _add_serve(sub: Any) -> None:
    """The ``serve`` command and its flags."""
    srv = sub.add_parser("serve", help="an OpenAI-compatible server (needs chatkit[serve])")
    srv.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    srv.add_argument("--name", help="the model id clients use (default: the file's stem)")
    srv.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    srv.add_argument("--port", type=_positive_int, default=8000)
    srv.add_argument("--api-key", help="required bearer token (or $CHATKIT_API_KEY)")
    srv.add_argument("--ctx-per-seq", type=_positive_int, default=None,
                     help="context tokens of each sequence (default: the model's training "
                          "context, as far as half the available memory holds its KV cache)")
    srv.add_argument("--n-ctx", type=_positive_int, default=None,
                     help="context tokens in all, shared by the sequences, instead of "
                          "--ctx-per-seq (default: --n-seq-max x --ctx-per-seq)")
    srv.add_argument("--n-seq-max", type=_positive_int, default=4,
                     help="KV sequences: turns decoded together")
    srv.add_argument("--cache-seqs", type=_non_negative_int, default=None,
                     help="more KV sequences that only keep finished requests' prompts for "
                          "later ones (default: --n-seq-max; emptied least recently used "
                          "first when the pool needs room; one pool only)")
    srv.add_argument("--max-queue", type=_positive_int, default=64,
                     help="turns that may wait for a sequence (then 429)")
    srv.add_argument("--drain-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                     help="on SIGTERM/SIGINT: new requests get 503, those in flight get this "
                          "long to finish, then streams end with an error (default 30)")
    srv.add_argument("--max-tokens-cap", type=_positive_int, default=None,
                     help="largest max_tokens a reply gets, also the default (default: the "
                          "room its prompt leaves); a request asking for more gets this many")
    srv.add_argument("--threads", type=_positive_int, default=None,
                     help="llama.cpp threads (default: every core)")
    srv.add_argument("--chat-template", metavar="FILE|NAME",
                     help="a Jinja chat template file, or a bundled one (chatml, hermes, "
                          "qwen3, gemma), for every chat request (default: the model's own)")
    srv.add_argument("--tool-format", metavar="DIALECT",
                     help="the tool-call dialect (default: detected from the template)")
    srv.add_argument("--kv", choices=("pool", "streams"), default=None,
                     help="the KV cache: one pool (prompt prefixes copied between requests, "
                          "cache sequences) or a stream per sequence (each request's "
                          "attention over its own cells; long contexts); default: one pool "
                          f"while each sequence's context is at most "
                          f"{POOL_MAX_CTX_PER_SEQ} tokens")
    srv.add_argument("--reproducible", action="store_true",
                     help="a KV stream per sequence in small steps, batch-invariant CPU "
                          "kernels (flash attention over a Q8_0 V cache), a sliding window's "
                          "KV kept whole (swa_full): each reply equals the same request "
                          "served alone")
    srv.add_argument("--speculative", action="store_true",
                     help="grammar-drafted speculative decoding for every request: the "
                          "tokens a schema forces ride in one verify step")
    _placement_flags(srv)
    _grammar_limit_flag(srv)
    srv.add_argument("--debug", action="store_true", help="show tracebacks")
    srv.set_defaults(func=_serve)


def _grammar_limit_flag(parser: Any) -> None:
    parser.add_argument("--grammar-limit", action="append", default=[], metavar="NAME=N",
                        help="an llguidance limit for every grammar (repeatable): "
                             "lexer_fuel, step_lexer_fuel, step_items, lexer_states, "
                             "grammar_size, row_items (default: llguidance's own)")


def _apply_grammar_limits(args: argparse.Namespace) -> None:
    """``--grammar-limit`` settings for the process; ``UsageError`` naming a bad one."""
    if not args.grammar_limit:
        return
    from .grammar.limits import GrammarLimits, set_grammar_limits

    try:
        set_grammar_limits(GrammarLimits.parse(args.grammar_limit))
    except ValueError as exc:
        raise UsageError(f"--grammar-limit {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        args = build_parser().parse_args(args_list)
        return int(args.func(args))
    except ChatkitError as exc:
        if debug:
            raise
        detail = " ".join(str(exc).split())  # one line
        print(f"chatkit: {type(exc).__name__}: {detail}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a foreign refusal that slipped through: still one named line
        if debug:
            raise
        print(f"chatkit: {InvalidParameter.__name__}: {exc}", file=sys.stderr)
        return InvalidParameter.exit_code


if __name__ == "__main__":
    sys.exit(main())
