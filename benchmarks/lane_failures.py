"""A pytest plugin for the GPU lane: each failing test's report is appended to
``$OUT/gpu-lane-failures.log`` the moment it arrives, so a lane cut short by a time limit still
says which tests failed and why (pytest's own summary comes only at the end)."""
from __future__ import annotations

import os
from pathlib import Path


def pytest_runtest_logreport(report) -> None:
    if report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller writes; workers do not
        path = Path(os.environ.get("OUT", "/tmp/gpu-lane")) / "gpu-lane-failures.log"
        with path.open("a") as log:
            log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n\n")
