"""One name -> function table behaviour for every calibrl registry (estimators, datasets, rewards)."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registering_decorator(table: dict[str, Callable], kind: str, name: str, overwrite: bool) -> Callable[[F], F]:
    """A decorator putting ``fn`` into ``table`` under ``name``.

    A taken name raises unless ``overwrite``; the same definition loaded twice (a module imported by name and
    again by file path, as verl's reward hook does) keeps the first registration instead of clashing.
    """

    def decorator(fn: F) -> F:
        if name in table and not overwrite:
            if _same_definition(table[name], fn):
                return fn
            raise ValueError(f"{kind} {name!r} is already registered; pass overwrite=True to replace it")
        table[name] = fn
        return fn

    return decorator


def _same_definition(a: Callable, b: Callable) -> bool:
    def origin(fn):
        code = getattr(fn, "__code__", None)
        return (getattr(fn, "__qualname__", None), code.co_filename if code else None)

    return a is b or origin(a) == origin(b)
