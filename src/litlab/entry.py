"""The scripts' entry (train.py, eval.py): Ctrl-C while the libraries load or the config is
composed, before a run takes over its handling, ends in one line and exit status 130, not in a
traceback of whichever import it interrupted. Only the standard library is imported here."""

from __future__ import annotations

import os
import signal
import sys
from importlib import import_module

INTERRUPTED = "litlab: interrupted (Ctrl-C)"


def end_with_the_launcher() -> None:
    """Under torchrun, a rank is sent SIGTERM when its launcher dies: torch's elastic agent
    starts each rank in a session of its own, so a torchrun killed hard (SIGKILL, the
    out-of-memory killer; a signal to its process group reaches it alone) left its ranks
    training on, unsupervised, to the end, in a run folder a resume= could write to as well
    (walkthrough 162). A SIGTERM stops a rank as a scheduler's does. Linux's
    PR_SET_PDEATHSIG; elsewhere nothing."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    launcher = os.getppid()
    pr_set_pdeathsig = 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM) != 0:
        return
    if os.getppid() != launcher:  # it died before the request took
        os.kill(os.getpid(), signal.SIGTERM)


def run(module: str) -> None:
    """Import ``module`` and call its ``main()``. Ctrl-C during the import is held until it
    ends (a KeyboardInterrupt raised inside a C++ extension's initialisation, torch's, reached
    pybind11, which cannot pass it on: "terminate called ...", SIGABRT, a core dump); a second
    Ctrl-C meanwhile ends the process at once."""
    end_with_the_launcher()
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
