"""``python -m calibrl``: the ``calibrl`` command line."""

from __future__ import annotations

from calibrl.cli import main

if __name__ == "__main__":
    main()
