"""Every public function and method of the package opens with a docstring (issue 25: a one-line
contract, as jupyter_client's ``provisioner_base`` gives its methods), read from the source (ast).

Public: its own name does not start with ``_`` (so no dunder), at a module's top level (also
under a top-level ``if``/``try``) or in a class, a class inside a class too, whatever the class's
name. A function defined inside a function is a helper of that one and is not counted. What the
docstring says is for review; this test sees only that there is one, and that it is not blank.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import jupyter_podman_hpc

PACKAGE = Path(jupyter_podman_hpc.__file__).parent
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def public_functions(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of each public function or method defined in ``body``."""
    for node in body:
        if isinstance(node, FUNCTIONS):
            if not node.name.startswith("_"):
                yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from public_functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.If):
            yield from public_functions(node.body + node.orelse, prefix)
        elif isinstance(node, ast.Try):
            yield from public_functions(
                node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body], prefix
            )


def missing(path: Path, root: Path) -> list[str]:
    """``path:line: name`` of each public function or method in ``path`` without a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    return [
        f"{where}:{node.lineno}: {name}"
        for name, node in public_functions(tree.body)
        if not (ast.get_docstring(node) or "").strip()
    ]


def test_every_public_function_and_method_has_a_docstring():
    found = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in missing(path, PACKAGE.parent)]
    assert found == []


def test_the_checker_sees_a_missing_docstring(tmp_path):
    """The check above would fail on a public method, a nested class's or a private class's,
    or a function under ``if``, that has none; it leaves private names and inner helpers alone."""
    module = tmp_path / "m.py"
    module.write_text(
        'def documented():\n    """Says what it returns."""\n    def helper():\n        pass\n'
        "def bare():\n    pass\n"
        "async def bare_async():\n    pass\n"
        'def blank():\n    """ """\n'
        "def _private():\n    pass\n"
        "class Thing:\n"
        "    def __init__(self):\n        pass\n"
        "    @property\n    def size(self):\n        return 1\n"
        "    class Inner:\n        def method(self):\n            pass\n"
        "class _Hidden:\n    def shown(self):\n        pass\n"
        "if True:\n    def conditional():\n        pass\n"
        "try:\n    pass\nexcept ImportError:\n    def fallback():\n        pass\n"
    )
    assert missing(module, tmp_path) == [
        "m.py:5: bare",
        "m.py:7: bare_async",
        "m.py:9: blank",
        "m.py:17: Thing.size",
        "m.py:20: Thing.Inner.method",
        "m.py:23: _Hidden.shown",
        "m.py:26: conditional",
        "m.py:31: fallback",
    ]
