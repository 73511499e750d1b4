"""The scripts' entry (train.py, eval.py): Ctrl-C while the libraries load or the config is
composed, before a run takes over its handling, ends in one line and exit status 130, not in a
traceback of whichever import it interrupted. Only the standard library is imported here."""

from __future__ import annotations

import os
import signal
import sys
from importlib import import_module

INTERRUPTED = "litlab: interrupted (Ctrl-C)"


def run(module: str) -> None:
    """Import ``module`` and call its ``main()``. Ctrl-C during the import is held until it
    ends (a KeyboardInterrupt raised inside a C++ extension's initialisation, torch's, reached
    pybind11, which cannot pass it on: "terminate called ...", SIGABRT, a core dump); a second
    Ctrl-C meanwhile ends the process at once."""
    asked: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if asked:  # asked twice: now
            print(INTERRUPTED, file=sys.stderr, flush=True)
            os._exit(130)
        asked.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        main = import_module(module).main
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        if asked:
            raise KeyboardInterrupt
        main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        raise SystemExit(130) from None
