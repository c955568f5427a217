"""What every benchmark ends with: its result as JSON on stdout, and in ``--output`` when given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], output: str | None = None) -> dict[str, Any]:
    text = json.dumps(result, indent=2)
    print(text)
    if output:
        Path(output).write_text(text + "\n")
    return result
