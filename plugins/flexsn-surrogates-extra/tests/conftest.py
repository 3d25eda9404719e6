"""Expose the plugin through real entry-point metadata when it is not installed.

If ``flexsn-surrogates-extra`` is installed (``pip install -e plugins/flexsn-surrogates-extra``)
its entry point is used as is; otherwise a ``flexsn_surrogates_extra-0.1.0.dist-info``
folder (METADATA + entry_points.txt) is written to a temporary site folder that goes
on ``sys.path`` together with the package's source folder, exactly what an install does.
"""
from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

DIST, VERSION, ENTRY, MODULE = "flexsn_surrogates_extra", "0.1.0", "surrogates_extra", "flexsn_surrogates_extra"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _installed() -> bool:
    return any(e.name == ENTRY for e in importlib.metadata.entry_points(group="flexsn_dsl"))


@pytest.fixture(scope="module", autouse=True)
def plugin_entry_point(tmp_path_factory):
    from flexsn_dsl.plugins import clear_cache

    added: list[str] = []
    if not _installed():
        site = tmp_path_factory.mktemp("site")
        info = site / f"{DIST}-{VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST.replace('_', '-')}\nVersion: {VERSION}\n")
        (info / "entry_points.txt").write_text(f"[flexsn_dsl]\n{ENTRY} = {MODULE}\n")
        added = [str(site), str(PACKAGE_ROOT)]
        sys.path[:0] = added
    clear_cache()
    assert _installed()
    yield
    for path in added:
        sys.path.remove(path)
    clear_cache()
