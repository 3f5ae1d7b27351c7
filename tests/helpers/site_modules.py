"""Site modules (modules.d) made for a test: a module that copies a freshly built library into
the container."""

from pathlib import Path

from tests.helpers.commands import run


def library_module(tmp_path: Path, name: str, destinations: list[str], conf_dir: str) -> Path:
    """A modules.d (returned) with one module, ``--name``, whose ``copy`` puts a freshly built
    ``lib<name>.so.1`` into each of ``destinations`` and an ld.so.conf.d file naming ``conf_dir``."""
    modules = tmp_path / "modules.d"
    modules.mkdir()
    library = tmp_path / f"lib{name}.so.1"
    source = tmp_path / f"{name}.c"
    source.write_text(f"int {name}_answer(void) {{ return 42; }}\n")
    run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,lib{name}.so.1", "-o", library, source])
    (tmp_path / f"{name}.conf").write_text(f"{conf_dir}\n")
    copies = "".join(f"  - {library}:{destination}\n" for destination in destinations)
    (modules / f"{name}.yaml").write_text(
        f"name: {name}\ncli_arg: {name}\nenv: ENABLE_{name.upper()}\nhelp: test module\n"
        f"copy:\n{copies}  - ../{name}.conf:/etc/ld.so.conf.d/{name}.conf\n"
    )
    for path in (tmp_path, modules):
        path.chmod(0o755)
    return modules
