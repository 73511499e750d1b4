"""Files written whole or not at all, by writers that may share a filesystem.

A sweep's jobs run on several hosts of a cluster, or in containers that share a volume and
all run as pid 1: a temporary file named by pid alone is one file for all of them.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def pid_namespace() -> int:
    """This process's pid namespace (an inode number; 0 where there is no /proc): containers on
    one host, even with the host's name (--network host), number their processes apart."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def writer_tag() -> str:
    """A name for this writer's own temporary file or folder, distinct from every other
    process's that shares the filesystem: hosts of a cluster, and containers sharing a volume,
    which all run as pid 1: ``<host>-<pid namespace>-<pid>-<12 random hex digits>``."""
    return f"{socket.gethostname()}-{pid_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


@contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO]:
    """Open ``path`` for writing so that readers see the old file or the whole new one, never
    part of one: the body writes a temporary file of this writer's own in the same folder,
    which is flushed to disk and renamed over ``path`` (atomic within a filesystem) when the
    body ends without an error, and removed when it raises. The folder is created if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{writer_tag()}.tmp")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
