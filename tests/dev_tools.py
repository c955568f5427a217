"""The command-line tools the dev extra installs (kubectl, hadolint, shellcheck, ...), found for the tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def dev_tool(name: str) -> str:
    """A binary installed by the dev extra: next to this interpreter first (the venv), else on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` not found: install the dev extra (pip install -e '.[dev]')")
    return found
