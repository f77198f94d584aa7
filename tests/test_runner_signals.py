"""Ctrl-C handling of the runner (no root): the first signal stops the run, no signal cuts a
teardown short, later ones only print a note."""

from __future__ import annotations

import os
import signal

import pytest

from lab.runner import Interrupts


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
