"""One name -> function table behaviour for every calibrl registry (estimators, datasets, rewards)."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registering_decorator(table: dict[str, Callable], kind: str, name: str, overwrite: bool) -> Callable[[F], F]:
    """A decorator putting ``fn`` into ``table`` under ``name`` (:func:`already_registered` decides clashes)."""

    def decorator(fn: F) -> F:
        if not already_registered(table.get(name), fn, kind=kind, name=name, overwrite=overwrite):
            table[name] = fn
        return fn

    return decorator


def already_registered(current: Callable | None, fn: Callable, *, kind: str, name: str, overwrite: bool) -> bool:
    """Whether ``name`` already holds ``fn`` (nothing to do): a taken name raises unless ``overwrite``; the same
    definition loaded twice (a module imported by name and again by file path, as verl's reward hook does) keeps
    the first registration instead of clashing."""
    if current is None or overwrite:
        return False
    if _same_definition(current, fn):
        return True
    raise ValueError(f"{kind} {name!r} is already registered; pass overwrite=True to replace it")


def _same_definition(a: Callable, b: Callable) -> bool:
    def origin(fn):
        code = getattr(fn, "__code__", None)
        return (getattr(fn, "__qualname__", None), code.co_filename if code else None)

    return a is b or origin(a) == origin(b)
