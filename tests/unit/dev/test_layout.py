"""The stack's node count (dev/stacklib/layout.py): what `STACK_NODES=N dev/stack up` accepts and the
Slurm host list it writes. The stack starts 4 nodes for the tests; `make bench` starts 16 for the scale
benchmark (bench/scale.py), which is where more than 4 run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "dev"))

from stacklib import layout


@pytest.mark.parametrize("value, count", [(None, 4), ("", 4), ("16", 16), (" 1 ", 1), ("n1 n2 n3 n4", 4), ("n1", 1)])
def test_a_count_or_the_names_env_exports(value, count):
    assert layout.requested_node_count(value) == count


@pytest.mark.parametrize("value", ["0", "33", "-2", "four", "n1 n3", "n2 n1", "n1 n2 x"])
def test_anything_else_is_refused_in_one_line(value):
    with pytest.raises(ValueError, match=r"^STACK_NODES must be a node count from 1 to 32 \(or n1 ... nN\), not "):
        layout.requested_node_count(value)


def test_the_host_list(monkeypatch):
    monkeypatch.setattr(layout, "NODES", layout.node_names(16))
    assert layout.nodes_expr() == "n[1-16]"
    monkeypatch.setattr(layout, "NODES", layout.node_names(1))
    assert layout.nodes_expr() == "n1"
