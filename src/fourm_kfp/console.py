"""What a person sees while the pipeline runs locally: stage starts and finishes, progress lines, and a closing table.

``kfp.local`` prints every task's executor input and output (hundreds of lines of JSON). :class:`ConsoleLog`
sends everything the process and its component subprocesses write (file descriptors 1 and 2) to a log file under
the run folder, and a thread follows that file, echoing to the real console only what :func:`console_line` keeps:
``▶ stage`` / ``✓ stage (12.3s)`` / ``✗ stage failed``, the stages' own progress lines (they carry a rate and an
ETA), warnings and errors. :func:`closing_summary` renders the table and where everything is.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TASK_START = re.compile(r"Executing task '([^']+)'")
_TASK_END = re.compile(r"Task '([^']+)' finished with status (\w+)")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
#: Bookkeeping tasks of the pipeline that need no line of their own.
QUIET_TASKS = ("open-lineage-run", "close-lineage-run")


class LineFilter:
    """Decides, line by line, what reaches the console (stateful: it times tasks and remembers the last error)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.started: dict[str, float] = {}
        self.last_error: str | None = None

    def __call__(self, raw: str) -> str | None:
        line = _ANSI.sub("", raw).rstrip()
        text = line.strip()
        if match := _TASK_START.search(text):
            name = match.group(1)
            self.started[name] = self.clock()
            return None if name in QUIET_TASKS else f"▶ {name}"
        if match := _TASK_END.search(text):
            name, status = match.groups()
            seconds = self.clock() - self.started.get(name, self.clock())
            if status == "SUCCESS":
                return None if name in QUIET_TASKS else f"✓ {name} ({seconds:.1f}s)"
            detail = f": {self.last_error}" if self.last_error else ""
            return f"✗ {name} failed after {seconds:.1f}s{detail}"
        if match := _LOG_LINE.match(text):
            level, logger, message = match.groups()
            if level != "INFO":
                return f"  {level.lower()}: {message}"
            return f"  {message}" if ("ETA" in message or "committed" in message) else None
        if match := _EXCEPTION.match(text):
            self.last_error = f"{match.group(1)}: {match.group(2)}"
            return None
        if " ETA " in text or text.endswith("ETA") or re.search(r"ETA \d+:\d\d:\d\d$", text):
            return f"  {text}"  # a LineProgress line
        return None


class ConsoleLog:
    """Redirect fds 1 and 2 to ``log_path`` while active; echo the filtered lines to the original stdout."""

    def __init__(self, log_path: str | os.PathLike, line_filter: Callable[[str], str | None] | None = None):
        self.log_path = Path(log_path)
        self.filter = line_filter or LineFilter()
        self._stop = threading.Event()

    def __enter__(self) -> "ConsoleLog":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._console = os.fdopen(os.dup(self._saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        self._thread = threading.Thread(target=self._follow, name="console-log", daemon=True)
        self._thread.start()
        return self

    def print(self, text: str) -> None:
        """Write straight to the console (not to the log)."""
        self._console.write(text + "\n")

    def _follow(self) -> None:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            fh.seek(0, os.SEEK_END)
            pending = ""
            while True:
                chunk = fh.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        shown = self.filter(pending)
                        pending = ""
                        if shown is not None:
                            self._console.write(shown + "\n")
                    continue
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._stop.set()
        self._thread.join(timeout=10)
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._console.close()


def closing_summary(summary: dict[str, Any]) -> str:
    """The table of stages and where the reports, the lineage store and the full log are."""
    rows = [("stage", "status", "seconds", "output")]
    rows += [(s["name"], s["status"], f"{s['seconds']:.1f}", s["output_uri"] or "-") for s in summary["stages"]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:{widths[0]}}  {r[1]:{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    machine = summary.get("machine")
    if "seconds" in summary:
        total = f"{'total':{widths[0]}}  {'':{widths[1]}}  {summary['seconds']:>{widths[2]}.1f}"
        if machine:
            bf16 = machine.get("bf16_matmul_gflops")
            total += (f"  on a CPU doing {machine['fp32_matmul_gflops']:.0f} GFLOP/s of fp32 matmul"
                      + (f" ({bf16:.0f} of bf16, which precision auto uses there)" if bf16 else "")
                      + f" on {machine['threads']} threads (measured after the run)")
        lines.append(total)
    tracking = summary["mlflow"]["tracking_uri"]
    lines += [
        "",
        "reports:    <output>/reports/ of each stage (also attached to the stage's MLflow run)",
        f"MLflow:     {tracking} (parent run {summary['mlflow']['parent_run_id']})",
        f"KFP log:    {summary.get('kfp_log') or '-'}",
    ]
    evaluation = next((s for s in summary["stages"] if s["name"] == "evaluate" and s["output_uri"]), None)
    if evaluation:
        lines.insert(-3, f"evaluation: {evaluation['output_uri']}/reports/evaluation_report.html (and .md)")
    gate = summary.get("model_gate")
    if gate and gate.get("version"):
        state = "champion" if gate["promoted"] else "candidate; the champion stays"
        lines.insert(-3, f"model:      {gate['model_name']} version {gate['version']} in the MLflow registry ({state}): "
                         f"{gate['reason']}")
    if tracking.startswith("sqlite:"):
        root = tracking.removeprefix("sqlite:///").removesuffix("/mlflow.db")
        ui = "http://127.0.0.1:5000/"
        lines.append(f"MLflow UI:  fourm-kfp ui --root {root}  (needs the `ui` extra: `make ui` installs it in a "
                     "checkout, else pip install 'fourm-kfp[ui]'), then")
        page = summary["mlflow"].get("parent_run_page", "")
        if page:
            lines.append(f"            {ui}{page}  (this run)")
        if summary["mlflow"].get("model_page"):
            lines.append(f"            {ui}{summary['mlflow']['model_page']}  (the registered model)")
    return "\n".join(lines)
