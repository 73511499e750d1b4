"""Every touch of a framework's private parts, each with why no public API serves and the
version it was checked against. tests/test_compat.py fails when one of them changes, so that an
upgrade breaks a test here rather than a user's run."""

from __future__ import annotations

import lightning as L


def stop_at_batch_end(trainer: L.Trainer) -> None:
    """Make Lightning stop training after the current batch as it does for SIGTERM: it raises
    SIGTERMException once the batch's bookkeeping is done, and callbacks see it in on_exception.

    Private: Lightning 2.6's ``trainer._signal_connector.received_sigterm`` (the flag its SIGTERM
    handler sets; ``trainer.should_stop`` instead ends the fit as finished, without the exception
    that marks a preemption). Lightning's own handler is not used under DDP: it broadcasts from
    inside the signal handler, and only the signalled rank raises, so ranks deadlock.
    """
    trainer._signal_connector.received_sigterm = True
