"""What the kernel tests share: a temporary Jupyter prefix."""

import pytest


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    """A prefix that Jupyter searches, and a user data dir of our own (never the real one)."""
    root = tmp_path / "prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(root / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    return root
