"""Ctrl-C handling of the runner (no root): the first signal stops the run, no signal cuts a
teardown short, later ones only print a note."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from lab.core.interrupts import Interrupts


def test_first_signal_raises_later_ones_only_note():
    notes = []
    with Interrupts(notes.append) as it:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # during the unwinding teardown: no second raise
        os.kill(os.getpid(), signal.SIGTERM)
    assert it.raised and len(notes) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_signal_during_teardown_is_raised_after_it():
    notes, steps = [], []
    with Interrupts(notes.append) as it:
        with pytest.raises(KeyboardInterrupt):
            with it.shielded():
                os.kill(os.getpid(), signal.SIGTERM)
                steps.append("teardown finished")
    assert steps == ["teardown finished"]
    assert notes == ["stopping after the teardown in progress"]


def test_signal_whose_raise_was_swallowed_stops_at_the_next_step(capfd):
    """A signal landing where Python cannot propagate an exception (an at-fork hook such as
    logging's, run on every subprocess spawn; a finalizer) has its KeyboardInterrupt dropped;
    the next check raises it, and no "Exception ignored" traceback reaches the terminal."""

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises inside __del__

    notes, hook = [], sys.unraisablehook
    with Interrupts(notes.append) as it:
        it.check()  # nothing pending: the run goes on
        Finalized()
        assert it.pending
        with pytest.raises(KeyboardInterrupt):
            it.check()
        with it.shielded():  # the unwinding teardown is not cut short by it
            pass
    assert "Exception ignored" not in capfd.readouterr().err
    assert sys.unraisablehook is hook


def test_fork_with_logging_hook_does_not_lose_the_interrupt():
    """The real case: SIGINT while subprocess forks (preexec_fn forces fork + at-fork hooks)."""
    import subprocess
    import threading

    notes = []
    with Interrupts(notes.append) as it:
        t = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        t.start()
        try:
            for _ in range(400):
                subprocess.run(["true"], preexec_fn=lambda: None, check=True)
        except KeyboardInterrupt:
            pass
        t.join()
        assert it.pending
        with pytest.raises(KeyboardInterrupt):
            it.check()
