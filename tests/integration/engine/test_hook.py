"""The OCI hook: a module's `copy` entries land in the container and ldconfig sees them."""

import subprocess

from tests.conftest import run


def test_module_copy_entries_and_ldconfig(squashed_base, stack, tmp_path):
    hpc = squashed_base
    modules = tmp_path / "modules.d"
    modules.mkdir()
    library = tmp_path / "libjphtest.so.1"
    source = tmp_path / "jphtest.c"
    source.write_text("int jph_answer(void) { return 42; }\n")
    run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libjphtest.so.1", "-o", library, source])
    (tmp_path / "jphtest.conf").write_text("/opt/jphtest/lib\n")
    (modules / "jphtest.yaml").write_text(
        "name: jphtest\ncli_arg: jphtest\nenv: ENABLE_JPHTEST\nhelp: test module\n"
        f"copy:\n  - {library}:/opt/jphtest/lib/\n  - ../jphtest.conf:/etc/ld.so.conf.d/jphtest.conf\n")
    for path in (tmp_path, modules):
        path.chmod(0o755)
    env = {**hpc.env, "PODMANHPC_MODULES_DIR": str(modules)}
    with_module = run(["podman-hpc", "run", "--rm", "--jphtest", stack.base_image, "sh", "-c",
                       "ls /opt/jphtest/lib; cat /etc/ld.so.conf.d/jphtest.conf; ldconfig -p | grep jphtest"],
                      env=env)
    lines = with_module.stdout.splitlines()
    assert lines[0] == "libjphtest.so.1"
    assert lines[1] == "/opt/jphtest/lib"
    assert "libjphtest.so.1" in lines[2] and "/opt/jphtest/lib/libjphtest.so.1" in lines[2]
    without = subprocess.run(["podman-hpc", "run", "--rm", stack.base_image, "ls", "/opt/jphtest"],
                             env=env, capture_output=True, text=True)
    assert without.returncode != 0  # only containers with the module get the files
