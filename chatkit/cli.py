"""The ``chatkit`` command. ``chatkit info`` describes a model; ``run`` lands with the CLI issue.

Every refusal is one line on stderr, ``chatkit: <ErrorName>: <details>``,
and the error's own exit code (``ChatkitError.exit_code``); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import sys

from .errors import ChatkitError


def _info(args: argparse.Namespace) -> int:
    from .model import Model

    model = Model.load(args.model, n_ctx=256, n_seq_max=1)
    print(f"path: {model.path}")
    print(f"n_vocab: {model.n_vocab}")
    print(f"bos/eos/eot: {model.bos_id}/{model.eos_id}/{model.eot_id}")
    print(f"chat template: {'yes' if model.chat_template else 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chatkit", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="describe a GGUF model")
    info.add_argument("--model", default=None, help="GGUF path (default: embedded SmolLM2)")
    info.set_defaults(func=_info)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ChatkitError as exc:
        if args.debug:
            raise
        print(f"chatkit: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
