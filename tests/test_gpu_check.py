"""scripts/gpu_check.sh, the one script a GPU loan runs: what it brings back must fit what the
device tool returns (at most 8 files from its output folder; on 2026-12-04 the test logs were
dropped, failures and all), and without CUDA it must stop at once, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest
import torch

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run(out, *args, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs the real thing")
def test_without_cuda_it_stops_at_once_and_says_why(tmp_path):
    done = run(tmp_path / "out")
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stdout
    assert "no CUDA GPU" in (tmp_path / "out" / "summary.txt").read_text()


def test_a_dry_run_brings_back_three_files_with_every_log_in_the_archive(tmp_path):
    out = tmp_path / "out"
    done = run(out, "120", "1", DRY_RUN="1", STEPS="tests_observability bench_not_named")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "machine.txt", "summary.txt"]
    rows = (out / "summary.txt").read_text().splitlines()
    assert rows[0].startswith("tests_observability") and "rc=0" in rows[0]
    assert rows[-1].startswith("total")
    assert len(rows) == 2  # STEPS: only the steps named ran
    with tarfile.open(out / "logs.tar.gz") as archive:
        names = {m.name for m in archive.getmembers() if m.isfile()}
        log = archive.extractfile("./tests_observability.log").read().decode()
    assert names == {"./tests_observability.log"}
    assert "skipped" in log  # the GPU tests skip themselves without CUDA
