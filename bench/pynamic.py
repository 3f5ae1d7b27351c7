"""Pynamic-like: every rank starts a Python program that imports many modules and shared libraries.

LLNL's Pynamic stresses what a large Python application does at start-up on
every rank: find, open, map and link many Python modules and shared
libraries. This one generates (deterministically, from a ``Workload``):

- ``modules`` pure-Python modules with ``functions`` functions each,
  byte-compiled beforehand (unchecked-hash .pyc, so no run ever writes one);
- ``extensions`` C extension modules with ``ext_functions`` functions each,
  compiled with the host's gcc against the host's Python headers (Debian
  bookworm's 3.11, the same Python as the base image's: one build serves
  both); each Python module imports one of them;
- ``utils`` plain shared libraries with ``util_functions`` functions each,
  which the extension modules link (found through ``$ORIGIN`` rpaths), as
  Pynamic's utility libraries;
- ``driver.py``: imports every module (``import_seconds``), then calls every
  Python function, each of which calls into its C extension and from there
  into a utility library (``visit_seconds``), and prints both with a checksum.

Every rank runs ``python3 -E -B driver.py`` (no PYTHON* variables, no byte
code written). Configurations: ``bare`` (the host's /usr/bin/python3),
``podman-exec`` (joining), ``podman-exec, fresh node`` (the same, after every node dropped its unpacked
copy of the image: a job's first step on a node, unpack included), ``podman-exec --no-join`` (podman
exec) and ``per-process`` (the base image's python3). Metrics: ``step_seconds``, the wall time of the whole ``srun``
(the start-up cost a user sees), and the slowest rank's ``import_seconds``
and ``visit_seconds``.

Two variants, reported as separate rows:

- ``in image``: the workload baked into an image (``Containerfile.pynamic``)
  and run from the squashed store, so the ranks import from the image's file
  system (squashfuse below fuse-overlayfs). This is the case Pynamic was
  made for and the one to read: on a real cluster bare metal would import
  from a parallel file system and the squashed image wins; here bare metal
  imports from a local disk, so the row shows what the image's file system
  costs against the fastest possible case.
- ``bind-mounted``: the containers (of the same image) import the very files
  bare metal does, from the shared scratch bind-mounted into the container;
  it isolates the cost of starting in a container from the cost of the
  image's file system.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from common import (
    FRESH_NODE,
    BenchError,
    Failure,
    PrivateStorage,
    Sample,
    alternating,
    bench_root,
    content_key,
    ensure_image,
    forget_unpacked,
    locked,
    timed,
)

BENCHMARK = "pynamic"
CONFIGS = ["bare", "podman-exec", FRESH_NODE, "podman-exec --no-join", "per-process"]
VARIANTS = ["in image", "bind-mounted"]
FULL_SIZES = [(1, 1), (4, 2)]
SMOKE_SIZES = [(1, 1)]
HERE = Path(__file__).resolve().parent
CONTAINERFILE = HERE / "Containerfile.pynamic"
IMAGE_DIR = "/opt/pynamic"
PYTHON = "/usr/bin/python3"
RESULT = re.compile(r"^PYNAMIC rank=(\d+) import=([0-9.]+) visit=([0-9.]+) checksum=(\d+)$", re.M)


@dataclass(frozen=True)
class Workload:
    modules: int
    functions: int
    extensions: int
    ext_functions: int
    utils: int
    util_functions: int

    def __str__(self) -> str:
        return (
            f"{self.modules} Python modules x {self.functions} functions, {self.extensions} C extension "
            f"modules x {self.ext_functions} functions, {self.utils} shared libraries x "
            f"{self.util_functions} functions"
        )


# Several seconds per rank on bare metal here (one rank, quiet machine).
FULL = Workload(modules=6000, functions=100, extensions=300, ext_functions=200, utils=30, util_functions=200)
SMOKE = Workload(modules=60, functions=10, extensions=6, ext_functions=20, utils=2, util_functions=20)


# --- the generated workload ----------------------------------------------------------


def _util_source(u: int, w: Workload) -> str:
    return "".join(
        f"long pynutil_{u}_{h}(long x) {{ return x * {h % 13 + 3} + {u} - (x >> {h % 5 + 1}); }}\n"
        for h in range(w.util_functions)
    )


def _extension_source(e: int, w: Workload) -> str:
    u = e % w.utils
    lines = ["#define PY_SSIZE_T_CLEAN", "#include <Python.h>", ""]
    lines += [f"long pynutil_{u}_{h}(long x);" for h in range(w.util_functions)]
    for g in range(w.ext_functions):
        lines.append(
            f"static PyObject *e_{g}(PyObject *self, PyObject *arg) {{\n"
            f"    long y = PyLong_AsLong(arg);\n"
            f"    for (int i = 0; i < {g % 7 + 1}; i++) y = y * 31 + i + {g};\n"
            f"    return PyLong_FromLong(pynutil_{u}_{g % w.util_functions}(y) & 0xffff);\n}}"
        )
    lines.append("static PyMethodDef methods[] = {")
    lines += [f'    {{"e_{g}", e_{g}, METH_O, NULL}},' for g in range(w.ext_functions)]
    lines += [
        "    {NULL, NULL, 0, NULL}};",
        f'static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "pyn_ext_{e}", NULL, -1, methods}};',
        f"PyMODINIT_FUNC PyInit_pyn_ext_{e}(void) {{ return PyModule_Create(&module); }}",
        "",
    ]
    return "\n".join(lines)


def _module_source(n: int, w: Workload) -> str:
    lines = [
        f'"""Generated module {n} of the Pynamic-like benchmark."""',
        "",
        f"import pyn_ext_{n % w.extensions} as _ext",
        "",
    ]
    for f in range(w.functions):
        lines += [
            f"def f_{f}(x):",
            f"    y = x + {n + f}",
            f"    for i in range({f % 3 + 1}):",
            "        y = (y * 7 + i) % 100003",
            f"    return _ext.e_{(7 * n + f) % w.ext_functions}(y)",
            "",
        ]
    return "\n".join(lines)


DRIVER = '''\
"""The Pynamic-like driver: import everything, visit every function, report per rank."""
import importlib
import os
import sys
import time

started = time.perf_counter()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
modules = [importlib.import_module(f"pyn_mod_{{n}}") for n in range({modules})]
imported = time.perf_counter()
checksum = 0
for module in modules:
    for f in range({functions}):
        checksum += getattr(module, f"f_{{f}}")(f)
visited = time.perf_counter()
rank = os.environ.get("SLURM_PROCID", "0")
print(f"PYNAMIC rank={{rank}} import={{imported - started:.4f}} visit={{visited - imported:.4f}} "
      f"checksum={{checksum}}", flush=True)
'''


def generate(w: Workload, payload: Path, build: Path, jobs: int | None = None) -> None:
    """Write the workload's files to ``payload`` (what runs) and its C sources to ``build``."""
    lib = payload / "lib"
    lib.mkdir(parents=True)
    build.mkdir(parents=True)
    for u in range(w.utils):
        (build / f"util_{u}.c").write_text(_util_source(u, w))
    for e in range(w.extensions):
        (build / f"ext_{e}.c").write_text(_extension_source(e, w))
    for n in range(w.modules):
        (lib / f"pyn_mod_{n}.py").write_text(_module_source(n, w))
    (payload / "driver.py").write_text(DRIVER.format(modules=w.modules, functions=w.functions))

    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise BenchError(f"no Python.h in {include}: install python3-dev on the host")

    def compile_(argv: list[str]) -> None:
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise BenchError(f"{' '.join(argv[:8])} ...: {result.stderr.strip()[-500:]}")

    cc = ["gcc", "-shared", "-fPIC", "-O1"]
    with ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
        list(
            pool.map(
                compile_,
                [[*cc, "-o", str(lib / f"libpynutil_{u}.so"), str(build / f"util_{u}.c")] for u in range(w.utils)],
            )
        )
        list(
            pool.map(
                compile_,
                [
                    [
                        *cc,
                        "-I",
                        include,
                        "-o",
                        str(lib / f"pyn_ext_{e}.so"),
                        str(build / f"ext_{e}.c"),
                        "-L",
                        str(lib),
                        f"-lpynutil_{e % w.utils}",
                        "-Wl,-rpath,$ORIGIN",
                    ]
                    for e in range(w.extensions)
                ],
            )
        )
    # byte code that is used whatever the files' times (a copy into an image keeps it valid)
    # (-E: beside the sources, whatever PYTHONPYCACHEPREFIX says)
    subprocess.run(
        [PYTHON, "-E", "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(lib)],
        check=True,
        capture_output=True,
    )
    compiled = len(list((lib / "__pycache__").glob("pyn_mod_*.pyc")))
    if compiled != w.modules:
        raise BenchError(f"byte-compiling the workload gave {compiled} of {w.modules} .pyc files in {lib}")
    for path in payload.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def workload_dir(w: Workload, log: Callable[[str], None] = print) -> Path:
    """The generated workload on the shared scratch (made once per workload and generator version)."""
    generator = [inspect.getsource(f) for f in (_util_source, _extension_source, _module_source, generate)]
    key = content_key(json.dumps(asdict(w), sort_keys=True), DRIVER, *generator, sysconfig.get_paths()["include"])
    root = bench_root() / "pynamic"
    final = root / key
    with locked(root / f".{key}.lock"):
        if (final / "payload" / "driver.py").is_file():
            return final
        log(f"generating the Pynamic-like workload ({w}) in {final} (once)")
        partial = root / f".{key}.{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            generate(w, partial / "payload", partial / "build")
            shutil.rmtree(partial / "build")
            os.rename(partial, final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return final


# --- running ---------------------------------------------------------------------------


@dataclass
class Setup:
    workload: Workload
    payload: Path  # on the shared scratch
    image: str  # the base image plus the payload in IMAGE_DIR
    env: dict[str, str]


def prepare(base_image: str, workload: Workload, storage: PrivateStorage, log: Callable[[str], None] = print) -> Setup:
    """The workload on the scratch and in its image (built from ``base_image``); containers run with
    the nodes' ``storage``."""
    payload = workload_dir(workload, log) / "payload"
    image = ensure_image("pynamic", CONTAINERFILE, payload, base_image, key_parts=[payload.parent.name], log=log)
    # the driver runs with -E (no PYTHON* variables); podman-hpc keeps the stack's pycache prefix
    return Setup(workload, payload, image, storage.env())


def describe(setup: Setup) -> str:
    return (
        f"Generated workload: {setup.workload}; every rank runs `python3 -E -B driver.py`. "
        'Rows "in image": containers import from the image (squashed store), bare metal from the '
        'shared scratch; rows "bind-mounted": everyone imports the same files on the scratch. '
        "import/visit seconds: the slowest rank's; step seconds: wall time of the whole srun."
    )


def command(setup: Setup, config: str, variant: str, nodes: int, per_node: int) -> list[str]:
    srun = ["srun", f"-N{nodes}", f"--ntasks-per-node={per_node}"]
    if config == "bare":
        return [*srun, PYTHON, "-E", "-B", str(setup.payload / "driver.py")]
    if variant == "in image":
        mount, driver = [], f"{IMAGE_DIR}/driver.py"
    else:  # the same image (the base image's files), the workload from the scratch
        directory = str(setup.payload)
        mount, driver = ["-v", f"{directory}:{directory}:ro"], f"{directory}/driver.py"
    image = setup.image
    app = [PYTHON, "-E", "-B", driver]
    if config in ("podman-exec", FRESH_NODE):
        return [*srun, "podman-hpc", "shared-run", *mount, image, *app]
    if config == "podman-exec --no-join":
        return [*srun, "podman-hpc", "shared-run", "--no-join", *mount, image, *app]
    if config == "per-process":
        return [*srun, "podman-hpc", "run", "--rm", *mount, image, *app]
    raise BenchError(f"unknown pynamic configuration: {config}")


def run_once(setup: Setup, config: str, variant: str, nodes: int, per_node: int) -> tuple[float, float, float]:
    """(step wall seconds, slowest import, slowest visit) of one run, in which every rank must finish."""
    if config == FRESH_NODE:
        forget_unpacked(setup.env)
    seconds, result = timed(command(setup, config, variant, nodes, per_node), setup.env, timeout=1800)
    ranks = RESULT.findall(result.stdout)
    label = f"pynamic {config} ({variant}) {nodes}x{per_node}"
    if sorted(int(r[0]) for r in ranks) != list(range(nodes * per_node)):
        tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
        raise BenchError(f"{label}: {len(ranks)} of {nodes * per_node} ranks reported: {tail}")
    if len({r[3] for r in ranks}) != 1:
        raise BenchError(f"{label}: the ranks' checksums differ: {sorted({r[3] for r in ranks})}")
    return seconds, max(float(r[1]) for r in ranks), max(float(r[2]) for r in ranks)


def measure(
    setup: Setup,
    configs: Sequence[str],
    variants: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    repetitions: int,
    failures: list[Failure],
    log: Callable[[str], None] = print,
) -> list[Sample]:
    nodes = max(n for n, _ in sizes)
    for variant in variants:  # warm up the page cache and every node's storage
        for config in configs:
            try:
                run_once(setup, config, variant, nodes, 1)
            except (BenchError, subprocess.TimeoutExpired) as err:
                log(f"pynamic {config} ({variant}): warm-up failed: {err}")
    samples = []
    for repetition in range(repetitions):
        for nodes, per_node in sizes:
            for variant in variants:
                size = f"{nodes}x{per_node} {variant}"
                for config in alternating(configs, repetition):
                    try:
                        seconds, imported, visited = run_once(setup, config, variant, nodes, per_node)
                    except (BenchError, subprocess.TimeoutExpired) as err:
                        failures.append(Failure(BENCHMARK, config, size, repetition, str(err)))
                        log(f"pynamic {config:<20} {size} rep {repetition}: FAILED {err}")
                        continue
                    for metric, value in (
                        ("step_seconds", seconds),
                        ("import_seconds", imported),
                        ("visit_seconds", visited),
                    ):
                        samples.append(Sample(BENCHMARK, config, size, repetition, metric, value))
                    log(
                        f"pynamic {config:<20} {size} rep {repetition}: step {seconds:.2f} s, "
                        f"import {imported:.2f} s, visit {visited:.2f} s"
                    )
    return samples


if __name__ == "__main__":  # generate a workload by hand: pynamic.py DIR [full|smoke]
    target = Path(sys.argv[1])
    chosen = SMOKE if sys.argv[2:] == ["smoke"] else FULL
    generate(chosen, target / "payload", target / "build")
    print(f"{chosen} in {target}")
