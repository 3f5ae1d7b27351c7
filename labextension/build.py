"""Build the JupyterLab extension in labextension/ into jupyter_podman_hpc/labextension.

The hatch build hook (hatch_build.py at the repository root) calls `build()`
for every wheel and editable install, so `pip install .` and
`pip install --editable .` both ship a built extension. Run it by hand after
editing the TypeScript, with a Python that has jupyterlab installed:

    python labextension/build.py              # rebuild if a source changed
    python labextension/build.py --force      # rebuild anyway
    python labextension/build.py --development  # unminified, with source maps

(A development build counts as up to date afterwards too: `--force` before
making a wheel from that checkout.)

The route works without any registry but npm's (see ../shared/host-notes):

1. `npm install --no-audit --no-fund` (yarn/jlpm are not used);
2. `tsc`, from labextension/src to labextension/lib;
3. `build-labextension --core-path <jupyterlab>/staging .` from
   @jupyterlab/builder, which writes the federated extension to the
   `jupyterlab.outputDir` of package.json (jupyter_podman_hpc/labextension).
   `jupyter labextension build` is not used: it looks packages up online.

The core path is the `staging` directory of the jupyterlab this Python
imports: in a pip build that is the isolated build environment, where the
hook has pip install jupyterlab whenever a build is needed (the hook's
`core-requirement` in pyproject.toml).

A build is skipped when the output is complete and newer than every source,
so a reinstall that changed nothing costs nothing. The output's package.json
is removed before a build and written back by build-labextension as its last
step, so an interrupted or failed build always rebuilds next time. Concurrent
builds of one checkout wait for each other (a lock on package.json).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_JSON = HERE / "package.json"
OUTPUT = (HERE / json.loads(PACKAGE_JSON.read_text())["jupyterlab"]["outputDir"]).resolve()
SOURCE_FILES = ["package.json", "package-lock.json", "tsconfig.json", ".npmrc", "build.py"]
SOURCE_DIRS = ["src", "schema", "style"]
MIN_NODE = 18

Log = Callable[[str], None]


class BuildError(Exception):
    """The extension cannot be built; the message says what to do."""


def _default_log(message: str) -> None:
    print(f"[labextension] {message}", file=sys.stderr, flush=True)


def sources() -> Iterator[Path]:
    """Every file whose change needs a rebuild."""
    for name in SOURCE_FILES:
        path = HERE / name
        if path.exists():
            yield path
    for name in SOURCE_DIRS:
        yield from (p for p in (HERE / name).rglob("*") if p.is_file())


def built_entry() -> Path | None:
    """The output's package.json if the output is a complete build, else None."""
    manifest = OUTPUT / "package.json"
    try:
        load = json.loads(manifest.read_text())["jupyterlab"]["_build"]["load"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest if (OUTPUT / load).is_file() else None


def is_fresh() -> bool:
    """True when the output is complete and newer than every source."""
    manifest = built_entry()
    if manifest is None:
        return False
    built = manifest.stat().st_mtime_ns
    return all(path.stat().st_mtime_ns <= built for path in sources())


def core_path() -> Path:
    """The staging directory of the jupyterlab this Python imports."""
    try:
        import jupyterlab
    except ImportError as error:
        raise BuildError(
            f"building the JupyterLab extension needs jupyterlab 4 importable by {sys.executable} "
            "(pip install 'jupyterlab>=4.2,<5', or pass --core-path); under pip, a source changed "
            "while the build environment was made: install again"
        ) from error
    staging = Path(jupyterlab.__file__).resolve().parent / "staging"
    if not (staging / "package.json").is_file():
        raise BuildError(f"jupyterlab at {staging.parent} has no staging/package.json: reinstall jupyterlab")
    return staging


def check_node() -> None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise BuildError(
                f"building the JupyterLab extension needs Node.js >= {MIN_NODE} and npm, and `{tool}` "
                "is not on PATH: install them (e.g. `apt-get install nodejs npm`) and retry"
            )
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    major = re.match(r"v(\d+)", version)
    if major is None or int(major.group(1)) < MIN_NODE:
        raise BuildError(f"Node.js {version or '(unknown)'} is too old: the extension needs Node.js >= {MIN_NODE}")


def _run(args: list[str], log: Log) -> None:
    log("$ " + " ".join(args))
    sys.stdout.flush()
    sys.stderr.flush()
    # The tools' output is inherited: pip shows it when the build fails (or with -v).
    result = subprocess.run(args, cwd=HERE)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(args)}` failed (exit code {result.returncode}) in {HERE}; see its output above")


def build(*, force: bool = False, development: bool = False, core: Path | None = None, log: Log = _default_log) -> bool:
    """Build the extension unless it is up to date; True if it was built.

    Raises BuildError with a message for the user when it cannot build.
    """
    with PACKAGE_JSON.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build of this checkout finishes first
        if not force and is_fresh():
            log(f"{OUTPUT} is up to date")
            return False
        check_node()
        core = core or core_path()
        started = time.monotonic()
        log(f"building the JupyterLab extension into {OUTPUT} (core: {core})")
        (OUTPUT / "package.json").unlink(missing_ok=True)  # incomplete until the build ends
        bin_dir = HERE / "node_modules" / ".bin"
        _run(["npm", "install", "--no-audit", "--no-fund", "--no-update-notifier"], log)
        if not (HERE / "lib" / "index.js").exists():
            # tsc's incremental state would otherwise claim lib/ is up to date.
            (HERE / "tsconfig.tsbuildinfo").unlink(missing_ok=True)
        _run([str(bin_dir / "tsc"), *(["--sourceMap"] if development else [])], log)
        _run(
            [
                str(bin_dir / "build-labextension"),
                *(["--development"] if development else []),
                "--core-path",
                str(core),
                ".",
            ],
            log,
        )
        if built_entry() is None:
            raise BuildError(f"build-labextension finished but {OUTPUT} holds no complete extension")
        log(f"built the JupyterLab extension in {time.monotonic() - started:.1f} s")
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the output is up to date")
    parser.add_argument("--development", action="store_true", help="unminified build with source maps")
    parser.add_argument("--core-path", type=Path, help="jupyterlab's staging directory (default: the importable one)")
    options = parser.parse_args(argv)
    try:
        build(force=options.force or options.development, development=options.development, core=options.core_path)
    except BuildError as error:
        print(f"labextension/build.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
