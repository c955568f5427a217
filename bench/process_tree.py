"""The processes below a process (Linux ``/proc``), for the benches that measure or kill a whole process tree."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` that is alive now (children, their children, ...)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.extend(children)
        todo.extend(children)
    return out
