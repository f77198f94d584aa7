"""SIGINT and SIGTERM during a run (`Interrupts`): the first stops the run, none cuts a teardown
short. Nothing here prints: notes go to the callable the runner passes."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager


class Interrupts:
    """SIGINT and SIGTERM during a run: the first one stops the run, none cuts a teardown short.

    Outside a teardown the first signal raises KeyboardInterrupt at once. Inside one (`shielded`)
    it is remembered and raised when the teardown is done. Every later signal only prints a
    note: the run is already stopping and its lab must still go.

    Python drops an exception raised where it cannot propagate: a signal that lands in an
    at-fork hook (every subprocess spawn runs logging's), a finalizer or a weakref callback
    prints "Exception ignored in ..." and the run would go on. So the runner also calls
    `check()` between steps; it raises again for a signal whose KeyboardInterrupt was lost.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, note: Callable[[str], None]):
        self.note = note
        self.pending = False  # a signal came
        self.raised = False  # ... and KeyboardInterrupt was raised for it
        self.depth = 0
        self._me = os.getpid()
        self._old: dict = {}

    def _handler(self, signum, frame):
        if os.getpid() != self._me:
            # a forked helper (pyroute2 forks to enter namespaces) inherits this handler: it
            # must die of the signal as it would have, not unwind the runner's stack
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.pending:
            self.note("stopping: tearing the lab down, please wait")
            return
        self.pending = True
        if self.depth:
            self.note("stopping after the teardown in progress")
            return
        self.raised = True
        raise KeyboardInterrupt

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
            self._old_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        if self._old:
            sys.unraisablehook = self._old_hook
        self._old = {}

    def _unraisable(self, u) -> None:
        """Our own KeyboardInterrupt, dropped where it could not propagate: `check()` raises it
        again at the next step, so no "Exception ignored" traceback for it on the terminal."""
        if u.exc_type is KeyboardInterrupt and self.pending:
            return
        self._old_hook(u)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a signal came (its first raise may have been swallowed).
        Called only on the forward path, between steps; unwinding code never calls it."""
        if self.pending and not self.depth:
            self.raised = True
            raise KeyboardInterrupt

    @contextmanager
    def shielded(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.pending and not self.raised and not self.depth:
            self.raised = True
            raise KeyboardInterrupt
