"""The package's layers, read from its imports (ast): no import circle, and no upward import.

Every import counts, also one inside a function (the circle this test was written against,
``cli -> engine.run.launcher -> engine.run.join -> rank -> cli``, closed through one). The parts,
from the bottom up (docs/developers/design.md: one engine, thin fronts):

- ``version`` and ``stepsocket``: leaves. ``stepsocket`` (the step socket protocol, on the
  path of every task of a podman-exec step) imports only modules written in C (built into
  the interpreter or its extension modules: they import no Python module), and ``os``/``sys``,
  which the interpreter has loaded before any of ours.
- ``engine``: everything a user can do; imports only the leaves. Inside it, rooms by role
  (``ENGINE_ORDER``, from the bottom up): its leaves (``errors``; ``progress`` and ``text``;
  ``reference``), ``base``, ``site``, ``store``, ``mount``, ``statebinds``, ``podman``,
  ``service`` and ``info``, ``images``, ``run``; a room imports only rooms below it.
- ``slurm`` (talking to Slurm) and ``kernels`` (container kernels): each on the engine, never
  on each other or on a front.
- the fronts, on the parts below them, never on each other: ``cli`` (the console script's
  commands), ``server`` (the Jupyter server extension), ``magics`` (IPython). What two fronts
  show alike lives in the engine (``engine.text``'s tables, ``engine.info``'s report).
- ``rank``: the console script's first stop; a task that is not its node's first runs from
  the leaf ``stepsocket`` (and ``engine.run.join``), every other command falls through to ``cli``.
- the package itself (``__init__``): the entry points Jupyter and IPython look up, which
  name ``magics`` only inside a function.
"""

import ast
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import jupyter_podman_hpc

PACKAGE = Path(jupyter_podman_hpc.__file__).parent
NAME = "jupyter_podman_hpc"

LEAVES = {"version", "stepsocket"}
ALLOWED = {
    "__init__": {"version", "magics"},
    "version": set(),
    "stepsocket": set(),
    "engine": LEAVES,
    "slurm": {"engine", *LEAVES},
    "kernels": {"engine", *LEAVES},
    "cli": {"engine", *LEAVES},
    "server": {"engine", "slurm", "kernels", *LEAVES},
    "magics": {"engine", "slurm", "kernels", *LEAVES},
    "rank": {"engine", "cli", *LEAVES},
}
ALWAYS_LOADED = {"os", "sys", "__future__"}  # loaded before any module of ours runs

# The engine's rooms (a subpackage, or a module at its top), from the bottom up; rooms on
# one rank do not import each other. ``hook`` is the old path of ``site.hook``'s console script.
ENGINE_ORDER = [
    {"errors"},
    {"progress", "text"},
    {"reference"},
    {"base"},
    {"site"},
    {"store"},
    {"mount"},
    {"statebinds"},
    {"podman"},
    {"service", "info"},
    {"images"},
    {"run"},
    {"hook", "__init__"},
]
ENGINE = f"{NAME}.engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports (ours: the module itself where ``from X import Y`` names one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            named = {f"{target}.{alias.name}" for alias in node.names}
            found |= named & known  # the submodules it names; the module itself if it names more
            found |= {target} if named - known else set()
    return found


def part(module: str) -> str:
    """The part of the package a module of ours belongs to (``engine``, ``cli``, ...)."""
    rest = module[len(NAME) + 1 :]
    return rest.split(".")[0] if rest else "__init__"


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: {t for t in imports(name, path, known) if t == NAME or t.startswith(NAME + ".")}
        for name, path in found.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module, or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_circle():
    assert cycles(graph()) == []


def test_no_part_imports_a_part_above_it():
    upward = []
    for module, targets in graph().items():
        for target in targets:
            source_part, target_part = part(module), part(target)
            if source_part == target_part:
                continue
            if target_part not in ALLOWED[source_part] and target != NAME:
                upward.append(f"{module} -> {target}")
    assert upward == []
    assert set(ALLOWED) == {part(module) for module in modules()}  # a new part states its place here


def engine_room(module: str) -> str:
    """The room of the engine a module of it sits in (``store`` for ``engine.store.fs``)."""
    rest = module[len(ENGINE) + 1 :]
    return rest.split(".")[0] if rest else "__init__"


def engine_rank(room: str) -> int:
    return next(rank for rank, rooms in enumerate(ENGINE_ORDER) if room in rooms)


def engine_imports_against_order(edges: dict[str, set[str]]) -> list[str]:
    """The engine's imports of a room not below the importer's (its own room excepted)."""
    against = []
    for module, targets in edges.items():
        if not (module == ENGINE or module.startswith(ENGINE + ".")):
            continue
        for target in targets:
            if not (target == ENGINE or target.startswith(ENGINE + ".")):
                continue
            source_room, target_room = engine_room(module), engine_room(target)
            if source_room != target_room and engine_rank(target_room) >= engine_rank(source_room):
                against.append(f"{module} -> {target}")
    return sorted(against)


def test_the_engine_imports_only_rooms_below_each_room():
    assert engine_imports_against_order(graph()) == []
    rooms = {engine_room(module) for module in modules() if module.startswith(ENGINE)}
    assert rooms == set().union(*ENGINE_ORDER)  # a new room states its place here


def test_the_checker_sees_an_import_against_the_engine_order(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from ..errors import EngineError\n\ndef f():\n    from ..run import join\n    from ..podman import Podman\n"
    )
    known = {f"{ENGINE}.run.join", f"{ENGINE}.errors", f"{ENGINE}.podman"}
    found = imports(f"{ENGINE}.store.m", module, known)
    assert found == {f"{ENGINE}.run.join", f"{ENGINE}.errors", f"{ENGINE}.podman"}
    assert engine_imports_against_order({f"{ENGINE}.store.m": found}) == [
        f"{ENGINE}.store.m -> {ENGINE}.podman",
        f"{ENGINE}.store.m -> {ENGINE}.run.join",
    ]
    assert engine_imports_against_order({f"{ENGINE}.text": {f"{ENGINE}.progress"}}) == [
        f"{ENGINE}.text -> {ENGINE}.progress"
    ]  # one rank: neither imports the other
    assert engine_imports_against_order({f"{ENGINE}.run.m": found}) == []


def written_in_c(name: str) -> bool:
    if name in sys.builtin_module_names:
        return True
    spec = importlib.util.find_spec(name)
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


def test_the_step_socket_imports_only_what_is_written_in_c():
    found = imports(f"{NAME}.stepsocket", PACKAGE / "stepsocket.py", set(modules()))
    assert {name for name in found - ALWAYS_LOADED if not written_in_c(name)} == set()
    assert written_in_c("_socket") and not written_in_c("socket")


def test_the_checker_sees_a_circle_and_a_lazy_upward_import(tmp_path):
    """The checks above would fail on the circle this test was written against."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    module = tmp_path / "m.py"
    module.write_text("def main():\n    from .cli import main\n    from . import stepsocket, VERSION\n")
    assert imports(f"{NAME}.rank", module, {f"{NAME}.stepsocket"}) == {f"{NAME}.cli", f"{NAME}.stepsocket", NAME}
    assert imports(f"{NAME}.engine.m", module, set()) == {f"{NAME}.engine.cli", f"{NAME}.engine"}
