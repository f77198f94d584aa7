"""The README's test command (`pytest -n 2`) runs two groups side by side: the VM tests and the
host's (tests/conftest.py). xdist's loadgroup scheduler reads a test's group from a suffix of its
node id (`...::test@host`); pytest 9.2 keeps node ids where xdist 3.8 cannot add it, and then
every test would be scheduled anywhere, two host tests at once (pyproject pins pytest < 9.2)."""

from __future__ import annotations

import pytest

from .conftest import VM_FIXTURES


def test_this_worker_sees_the_group_in_the_node_id(request):
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not run by a pytest-xdist worker (the README's command passes -n 2)")
    assert request.node.nodeid.endswith("@host"), request.node.nodeid


def test_a_vm_test_is_in_the_vm_group(request):
    items = [i for i in request.session.items if VM_FIXTURES & set(i.fixturenames)]
    for item in items:
        assert item.get_closest_marker("xdist_group").args == ("vm",), item.nodeid
    if hasattr(request.config, "workerinput"):
        assert all(i.nodeid.endswith("@vm") for i in items), [i.nodeid for i in items][:3]
