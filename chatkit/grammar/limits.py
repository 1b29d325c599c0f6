"""llguidance's resource limits, set explicitly for every matcher chatkit builds.

A grammar (or schema) that needs more than these is refused by name: ``GrammarInvalid``
(or ``SchemaUnsupported``/``SchemaInvalid`` for a schema) before the first token where
llguidance sees it then, else at the token where it outgrows them (over HTTP a 400, or an
error event after a stream's 200). Compile time is bounded by the same numbers: the lexer
fuel and the grammar size cap the work before the first mask, the step limits each mask.

The defaults are llguidance 1.9's own. ``chatkit serve --grammar-limit NAME=N`` (repeatable)
or :func:`set_grammar_limits` change them for the process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.coldstart import bare_import

if TYPE_CHECKING:
    from llguidance import LLParserLimits

__all__ = ["GrammarLimits", "grammar_limits", "set_grammar_limits"]


@dataclass(frozen=True)
class GrammarLimits:
    """llguidance's parser and lexer limits (``LLParserLimits``)."""

    lexer_fuel: int = 1_000_000
    """Work building the lexer's regexes before the first mask."""
    step_lexer_fuel: int = 200_000
    """Lexer work per mask."""
    step_items: int = 50_000
    """Earley items per mask."""
    lexer_states: int = 250_000
    """Distinct lexer states (1-2 kB of memory each)."""
    grammar_size: int = 500_000
    """Symbols in the grammar's productions."""
    row_items: int = 2_000
    """Items in one row of the parser (branching)."""

    def native(self) -> LLParserLimits:
        """The ``llguidance.LLParserLimits`` of these numbers."""
        llguidance = bare_import.llguidance()
        made: LLParserLimits = llguidance.LLParserLimits(
            max_items_in_row=self.row_items, initial_lexer_fuel=self.lexer_fuel,
            step_lexer_fuel=self.step_lexer_fuel, step_max_items=self.step_items,
            max_lexer_states=self.lexer_states, max_grammar_size=self.grammar_size,
            verbose_errors=False)  # no parser state in messages a client reads
        return made

    @classmethod
    def parse(cls, settings: list[str]) -> GrammarLimits:
        """Limits from ``NAME=N`` settings (the defaults for the rest). Raises ``ValueError``
        naming an unknown name or a value that is not a positive integer."""
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, int] = {}
        for setting in settings:
            name, sep, value = setting.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise ValueError(f"{setting!r}: a grammar limit is NAME=N, NAME one of "
                                 + ", ".join(sorted(known)))
            try:
                number = int(value)
            except ValueError:
                number = 0
            if number <= 0:
                raise ValueError(f"{setting!r}: the limit must be a positive integer")
            values[name] = number
        return cls(**values)


_current = GrammarLimits()
_native: LLParserLimits | None = None


def grammar_limits() -> GrammarLimits:
    """The limits every new matcher gets."""
    return _current


def set_grammar_limits(new: GrammarLimits) -> None:
    """Use ``new`` for every matcher built from now on (constraints already built keep
    theirs)."""
    global _current, _native
    _current, _native = new, None


def native_limits() -> LLParserLimits:
    """The current limits as ``llguidance.LLParserLimits`` (built once per setting)."""
    global _native
    if _native is None:
        _native = _current.native()
    return _native
