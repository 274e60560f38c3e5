"""numba's ``njit`` with its on-disk cache wherever one can be written: the loops calibrl compiles
(:mod:`calibrl.metrics._replicate_kernel`, about a second; :mod:`calibrl.selection._lbfgsb`, RPC's fits, about 13 s
on 2 cores) are compiled once per machine and read back by later processes (under a second). numba keeps the cache
beside the module (``__pycache__``), else in the user's cache folder (or ``$NUMBA_CACHE_DIR``); where neither can be
written (a read-only install run by a user without a writable home), numba refuses ``cache=True`` when the function
is defined, and the loop is then compiled in each process instead (the times above, each process) rather than
failing the import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit

__all__ = ["compiled"]


def compiled(**options: Any) -> Callable[[Callable], Callable]:
    """``@compiled(nogil=True, ...)``: ``numba.njit(cache=True, **options)``, or without the cache where numba has
    no folder it can write it to."""

    def wrap(function: Callable) -> Callable:
        try:
            return njit(cache=True, **options)(function)
        except RuntimeError:  # "cannot cache function ...: no locator available for file ..."
            return njit(**options)(function)

    return wrap
