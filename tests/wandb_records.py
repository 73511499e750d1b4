"""Read a W&B offline run file (run-<id>.wandb) the way `wandb sync` would replay it.

wandb >= 0.19 no longer ships a Python reader for its transaction log, so the tests read the
documented LevelDB-log framing themselves and parse each record with wandb's own protobufs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = 7  # ":W&B" + magic 0xBEE1 + version
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, pending = [], HEADER, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # block trailer too small for a header: skip to the next block
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _artifact(artifact: Any) -> dict[str, Any]:
    """A logged artifact: name, type, aliases, metadata and files (name in the artifact: the
    local file it is read from when uploaded)."""
    return {
        "name": artifact.name,
        "type": artifact.type,
        "aliases": list(artifact.aliases),
        "metadata": json.loads(artifact.metadata or "{}"),
        "files": {entry.path: entry.local_path for entry in artifact.manifest.contents},
    }


def offline_run(run_dir: Path) -> dict[str, Any]:
    """The run's identity, config, summary, history and artifacts, from its .wandb file."""
    (path,) = list(Path(run_dir).glob("run-*.wandb"))
    info: dict[str, Any] = {"config": {}, "summary": {}, "history": [], "artifacts": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            info.update(
                id=run.run_id,
                project=run.project,
                group=run.run_group,
                job_type=run.job_type,
                name=run.display_name,
                tags=list(run.tags),
            )
            info["config"].update({i.key: json.loads(i.value_json) for i in run.config.update})
        elif kind == "config":
            info["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "summary":
            info["summary"].update(
                {_key(i): json.loads(i.value_json) for i in record.summary.update}
            )
        elif kind == "history":
            info["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "artifact":
            info["artifacts"].append(_artifact(record.artifact))
        elif kind == "request" and record.request.WhichOneof("request_type") == "log_artifact":
            info["artifacts"].append(_artifact(record.request.log_artifact.artifact))
        elif kind == "exit":  # how the run ended: W&B shows a non-zero code as failed
            info["exit_code"] = record.exit.exit_code
    return info
