"""What every benchmark ends with: its result as JSON on stdout, and in ``--output`` when given.

The JSON is strict: a metric that is undefined (a precision with nothing predicted, a ratio over nothing: NaN or
infinite) is written as ``null``, which every JSON reader parses, not as ``NaN``, which Python writes by default and
strict readers (``jq``, browsers, most languages) reject.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (NumPy's too) inside dicts, lists and tuples replaced by ``None``."""
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):  # np.float64 is a float
        return None
    if hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:  # other NumPy scalars
        return strict(value.item())
    return value


def emit(result: dict[str, Any], output: str | None = None) -> dict[str, Any]:
    text = json.dumps(strict(result), indent=2, allow_nan=False)
    print(text)
    if output:
        Path(output).write_text(text + "\n")
    return result
