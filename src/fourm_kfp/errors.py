"""The one base class of errors a user can fix: bad config, bad data, a missing input, an unreachable store.

The CLI prints such an error as one line, ``Error: <message>``, and exits non-zero without a traceback
(``--debug`` shows it). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An error whose message tells the user what to fix, naming the problem and the place."""
