"""``feedrate`` as a user types it, in a process of its own: the one runner of the tests that
judge the command line by its exit status, its output and the files it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def feedrate_cli(
    *args: str,
    cwd: Path | None = None,
    cache: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 240.0,
) -> subprocess.CompletedProcess[str]:
    """``python -m feedrate ARGS`` in ``cwd``, run to its end within ``timeout`` seconds, its
    output captured as text. ``env`` is its environment (this process's by default); ``cache``,
    where given, its ``FEEDRATE_CACHE_DIR``."""
    environ = dict(os.environ if env is None else env)
    if cache is not None:
        environ["FEEDRATE_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "feedrate", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environ,
        timeout=timeout,
    )
