"""Names an engine lends from a member: composition, one line a name, typed as the member's.

``Model`` is composed of its vocabulary (``model.vocab``) and its KV cells and sequence
leases (``model.kv``); its flat public surface (``model.tokenize``, ``model.lease_seq``,
``model.copies_prefixes``, ...) is those members' own, lent by the descriptors here, so a
name is written once, in the member that does the work, with its signature and docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, Never, ParamSpec, TypeVar, overload

__all__: list[str] = []

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Lent(Generic[P, R]):
    """``tokenize = Lent("vocab", Vocab.tokenize)`` in a class body: ``obj.tokenize`` is
    ``obj.vocab.tokenize``, the member's bound method (its signature and docstring)."""

    def __init__(self, member: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.member = member
        self.attr = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Lent[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.member), self.attr)


class LentValue(Generic[T]):
    """``copies_prefixes: LentValue[bool] = LentValue("kv")``: ``obj.copies_prefixes`` reads
    ``obj.kv.copies_prefixes``, read-only: assigning it is a type error (mypy) and raises
    ``AttributeError`` (what the engine was built with is not changed by a write). A value
    the engine lets its user set is a :class:`LentSetting`."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> LentValue[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.member), self.attr)

    def __set__(self, obj: object, value: Never) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.attr} is read-only "
                             f"(lent from its {self.member!r})")


class LentSetting(LentValue[T]):
    """``seq_wait: LentSetting[float] = LentSetting("kv")``: a lent value its user may set;
    assigning ``obj.seq_wait`` writes ``obj.kv.seq_wait``."""

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.member), self.attr, value)
