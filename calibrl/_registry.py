"""One name -> function table behaviour for every calibrl registry (estimators, datasets, rewards, metrics), and
the import of a user's plugins (modules that register into them)."""

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


class PluginError(ValueError):
    """A plugin could not be imported; the message is one line naming it."""


def import_plugins(entries: list[str], source: str) -> list[str]:
    """Import each plugin of ``entries``: a module name (on ``PYTHONPATH`` or installed) or the path of a ``.py``
    file, so what it registers (an estimator, a reward, a dataset, a metric) is known before anything names it.
    ``source`` prefixes every message (the recipe or option that named them). A missing module or file, an error
    raised by the plugin, ``sys.exit`` or Ctrl-C while it is imported are a one-line :class:`PluginError`."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    for entry in entries:
        try:
            if entry.endswith(".py"):
                path = Path(entry)
                if not path.is_file():
                    raise PluginError(f"{source}: no plugin file {entry!r}")
                name = f"calibrl_plugin_{path.stem}"
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(entry)
        except PluginError:
            raise
        except ModuleNotFoundError as exc:
            if exc.name is not None and entry.startswith(exc.name):  # the plugin itself, not one of its imports
                raise PluginError(f"{source}: no module named {entry!r} (is its folder on PYTHONPATH?)") from None
            raise PluginError(f"{source}: {entry!r} failed to import: {exc}") from None
        except Exception as exc:  # a plugin's own error: shown in one line, the plugin named
            raise PluginError(f"{source}: {entry!r} failed to import: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())}") from None
        except SystemExit as exc:  # sys.exit() at import would end calibrl with nothing said
            raise PluginError(f"{source}: {entry!r} called sys.exit({exc.code!r}) while it was imported") from None
        except KeyboardInterrupt:
            raise PluginError(f"{source}: {entry!r} was interrupted while it was imported (KeyboardInterrupt)") \
                from None
    return list(entries)
