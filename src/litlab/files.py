"""Files written whole or not at all, by writers that may share a filesystem.

A sweep's jobs run on several hosts of a cluster, or in containers that share a volume and
all run as pid 1: a temporary file named by pid alone is one file for all of them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

ABANDONED_AFTER_S = 3600  # a temporary file unchanged this long was left by a killed writer


def pid_namespace() -> int:
    """This process's pid namespace (an inode number; 0 where there is no /proc): containers on
    one host, even with the host's name (--network host), number their processes apart."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def started_s(summary: dict[str, Any] | None) -> float | None:
    """When a summary's run part started (its "started_at", seconds since the epoch); None
    where it says none readable."""
    try:
        return datetime.fromisoformat((summary or {})["started_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def run_process(summary: dict[str, Any] | None) -> tuple[str | None, int | None]:
    """Whether the process of a run its summary says is running still runs: ("alive", pid)
    where it runs on this machine and is the one that started the run; ("gone", pid) where it
    ran here and is gone (a run killed hard, SIGKILL, out of memory, left "running"; a zombie,
    or a later process given its number); (None, None) where nothing can be told: another
    machine, another pid namespace (containers on one host with its name, --network host,
    number their processes apart; older summaries say none), or a summary not "running"."""
    if not summary or summary.get("status") != "running" or summary.get("host") != platform.node():
        return None, None
    if summary.get("pid_namespace") != pid_namespace() or not pid_namespace():
        return None, None
    pid = summary.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid == os.getpid():
        return None, None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone", pid
    except PermissionError:  # another user's process: alive
        pass
    began, started = process_start(pid), started_s(summary)
    if began is not None and (began == -1 or (started is not None and began > started + 5)):
        return "gone", pid  # a zombie, or a later process under the number
    return "alive", pid


def in_progress(folder: Path, pid: int, continued_by: str) -> str:
    """The refusal of a second process in a run folder whose run ``pid`` still trains here;
    ``continued_by``: what continues the run once it is stopped."""
    return (
        f"{folder} holds a run still in progress: process {pid} on this machine started it and "
        "is running; two processes training in one folder would mix their checkpoints and "
        f"logs. Let it finish, or stop it first (kill -TERM {pid} saves a checkpoint that "
        f"{continued_by} continues from)"
    )


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch; -1 for a zombie), from Linux's
    /proc; None where that cannot be read (another system)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    fields = stat.rpartition(")")[2].split()  # after the command's name, which may hold spaces
    if fields[0] == "Z":
        return -1
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def writer_tag() -> str:
    """A name for this writer's own temporary file or folder, distinct from every other
    process's that shares the filesystem: hosts of a cluster, and containers sharing a volume,
    which all run as pid 1: ``<host>-<pid namespace>-<pid>-<12 random hex digits>``."""
    return f"{socket.gethostname()}-{pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open ``path`` for writing so that readers see the old file or the whole new one, never
    part of one: the body writes a temporary file of this writer's own in the same folder
    (``.<name>.<random>.tmp``), which is flushed to disk and renamed over ``path`` (atomic
    within a filesystem) when the body ends without an error, and removed when it raises. The
    folder is created if missing. Temporary files of ``path`` left by writers killed mid-write
    (a checkpoint saved at a preemption signal, then SIGKILL) are removed by the next writer
    that finishes, once unchanged for an hour."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # random alone: unique, and short (host names are up to 64 characters, file names 255)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:16]}.tmp")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:  # the file is written: tidying up may fail, the write has not
        for left in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            with contextlib.suppress(OSError):  # gone already, or not ours to remove
                if time.time() - left.stat().st_mtime > ABANDONED_AFTER_S:
                    left.unlink()
    except OSError:
        pass  # the folder unreadable a moment (NFS)


# A run folder's checkpoints that resume= continues from (checkpoints/): epoch ends and signals,
# and every N steps.
CHECKPOINTS = ("last.ckpt", "step.ckpt")


def resumable_checkpoints(folder: Path) -> list[Path]:
    """The files ``resume=<folder>`` may continue from: checkpoints/last.ckpt and step.ckpt, and
    Lightning's SLURM auto-requeue saves (hpc_ckpt_<n>.ckpt)."""
    found = [
        folder / "checkpoints" / name
        for name in CHECKPOINTS
        if (folder / "checkpoints" / name).is_file()
    ]
    return found + list(folder.glob("hpc_ckpt_*.ckpt"))
