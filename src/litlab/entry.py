"""The scripts' entry (train.py, eval.py): Ctrl-C while the libraries load or the config is
composed, before a run takes over its handling, ends in one line and exit status 130, not in a
traceback of whichever import it interrupted. Only the standard library is imported here."""

from __future__ import annotations

import sys
from importlib import import_module


def run(module: str) -> None:
    """Import ``module`` and call its ``main()``."""
    try:
        import_module(module).main()
    except KeyboardInterrupt:
        print("litlab: interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None
