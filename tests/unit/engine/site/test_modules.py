"""Site modules: the schema, conflicts and dependencies, bind rules, the shipped modules."""

import pytest

from jupyter_podman_hpc.engine.base.private import UnsafeDirectory
from jupyter_podman_hpc.engine.errors import ModuleError
from jupyter_podman_hpc.engine.site.config import SITE_DATA
from jupyter_podman_hpc.engine.site.modules import (
    PRIVATE_SHM,
    ModuleSet,
    Mount,
    cdi_kind_available,
    load_module,
    resolve_binds,
)


def write_module(directory, name, text):
    (directory / f"{name}.yaml").write_text(text)


@pytest.fixture
def site(tmp_path):
    write_module(
        tmp_path,
        "a",
        "name: a\ncli_arg: alpha\nenv: ENABLE_A\nconflicts: [b]\nadditional_args: ['-e SLURM_*', '--ipc=host']\n",
    )
    write_module(tmp_path, "b", "name: b\ncli_arg: beta\nenv: ENABLE_B\n")
    write_module(tmp_path, "c", "name: c\ncli_arg: gamma\nenv: ENABLE_C\ndepends_on: [b]\n")
    return ModuleSet.load(str(tmp_path))


def test_modules_become_flags_and_arguments(site):
    assert sorted(site.by_flag()) == ["--alpha", "--beta", "--gamma"]
    args = site.podman_args(site.select(["alpha"]), {})
    assert args == ["-e", "SLURM_*", "--ipc=host", "-e", "ENABLE_A=1"]


def test_the_hook_is_asked_for_only_when_a_module_copies_files(site, tmp_path):
    assert not any("hook_tool" in a for a in site.podman_args(site.select(["alpha"]), {}))
    write_module(tmp_path, "e", "name: e\ncli_arg: epsilon\nenv: ENABLE_E\ncopy: [/etc/hostname:/etc/x]\n")
    modules = ModuleSet.load(str(tmp_path))
    args = modules.podman_args(modules.select(["epsilon"]), {})
    assert "podman_hpc.hook_tool=true" in args and f"PODMANHPC_MODULES_DIR={tmp_path}" in args


def test_conflicting_modules_are_an_error(site):
    with pytest.raises(ModuleError, match="'a' \\(--alpha\\) conflicts with 'b' \\(--beta\\)"):
        site.select(["alpha", "beta"])


def test_missing_dependency_is_an_error_saying_which_flag_to_add(site):
    with pytest.raises(ModuleError, match="needs 'b': add --beta"):
        site.select(["gamma"])
    assert [m.name for m in site.select(["gamma", "beta"])] == ["c", "b"]


def test_unknown_module_and_unknown_key(site, tmp_path):
    with pytest.raises(ModuleError, match="unknown module 'zeta'"):
        site.select(["zeta"])
    write_module(tmp_path, "d", "name: d\nenv: X\nbindd: [/a]\n")
    with pytest.raises(ModuleError, match="unknown key 'bindd'"):
        ModuleSet.load(str(tmp_path))


def test_bind_rules_resolve_like_podman_hpc(tmp_path):
    for name in ("libnvidia-ml.so.1", "libnvcuvid.so.1"):
        (tmp_path / name).write_text("")
    env = {"HOME": str(tmp_path)}
    pairs = resolve_binds(
        [f"{tmp_path}/libnv*:/usr/lib64/", "$HOME:$HOME", "/does/not/exist:/x", "$UNSET_VARIABLE:/y"], "/modules", env
    )
    assert Mount(f"{tmp_path}/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1") in pairs
    assert Mount(f"{tmp_path}/libnvcuvid.so.1", "/usr/lib64/libnvcuvid.so.1") in pairs
    assert Mount(str(tmp_path), str(tmp_path)) in pairs
    assert len(pairs) == 3  # missing sources and unset variables mount nothing


def test_relative_sources_are_relative_to_the_modules_directory():
    pairs = resolve_binds(["../01-gpu.conf:/etc/ld.so.conf.d/02-gpu.conf"], str(SITE_DATA / "modules.d"), {})
    assert pairs == [Mount(str(SITE_DATA / "01-gpu.conf"), "/etc/ld.so.conf.d/02-gpu.conf")]


def test_a_bind_rule_may_be_read_only(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert resolve_binds(["$HOME:/h:ro", "$HOME::ro", "$HOME:/w:rw"], "/modules", env) == [
        Mount(str(tmp_path), "/h", "ro"),
        Mount(str(tmp_path), str(tmp_path), "ro"),
        Mount(str(tmp_path), "/w", "rw"),
    ]
    with pytest.raises(ModuleError, match="unknown option 'rx'"):
        resolve_binds(["$HOME:/h:rx"], "/modules", env)


def test_read_only_binds_reach_podman_and_bad_options_are_refused_at_load(tmp_path):
    write_module(tmp_path, "r", f"name: r\ncli_arg: r\nenv: R\nbind: ['{tmp_path}:/data:ro']\n")
    site = ModuleSet.load(str(tmp_path))
    assert site.podman_args(site.select(["r"]), {}) == ["-e", "R=1", "-v", f"{tmp_path}:/data:ro"]
    write_module(tmp_path, "c", f"name: c\nenv: C\ncopy: ['{tmp_path}:/data:ro']\n")
    with pytest.raises(ModuleError, match="apply to bind rules only"):
        ModuleSet.load(str(tmp_path))
    write_module(tmp_path, "c", f"name: c\nenv: C\nbind: ['{tmp_path}:/data:bogus']\n")
    with pytest.raises(ModuleError, match="unknown option 'bogus'"):
        ModuleSet.load(str(tmp_path))


def test_the_private_shm_directory_is_made_0700_for_modules_that_use_it(tmp_path):
    write_module(tmp_path, "m", f"name: m\ncli_arg: m\nenv: M\nbind: ['${PRIVATE_SHM}:/dev/shm']\n")
    site = ModuleSet.load(str(tmp_path))
    shm = tmp_path / "shm" / "ipc"
    args = site.podman_args(site.select(["m"]), {PRIVATE_SHM: str(shm)})
    assert args[-2:] == ["-v", f"{shm}:/dev/shm"]
    assert shm.is_dir() and oct(shm.stat().st_mode & 0o777) == "0o700"
    shm.chmod(0o777)  # as if another user had made it first, to read the segments
    with pytest.raises(UnsafeDirectory, match="others may have written into it"):
        site.podman_args(site.select(["m"]), {PRIVATE_SHM: str(shm)})


def test_cdi_device_only_when_a_spec_declares_it(tmp_path):
    assert not cdi_kind_available("nvidia.com/gpu", [str(tmp_path)])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert cdi_kind_available("nvidia.com/gpu", [str(tmp_path)])


def test_shipped_modules_load_and_the_mpi_ones_conflict(tmp_path):
    modules = ModuleSet.load(str(SITE_DATA / "modules.d"))
    assert {"gpu", "openmpi-pmix", "openmpi-pmi2", "mpich", "jupyter", "home", "scratch"} <= {m.name for m in modules}
    with pytest.raises(ModuleError, match="conflicts"):
        modules.select(["openmpi-pmix", "openmpi-pmi2"])
    jupyter = modules.podman_args(modules.select(["jupyter"]), {"HOME": str(tmp_path)})
    assert "--network=host" in jupyter and f"{tmp_path}:{tmp_path}" in jupyter
    # the engine's state (/tmp/<uid>_hpc, /dev/shm/<uid>_hpc) is bound by no shipped module
    for module in modules:
        for rule in module.bind:
            assert rule.split(":")[0] not in ("/tmp", "/dev/shm", "/dev", "/"), (module.name, rule)
    for name in ("mpich", "openmpi-pmi2", "openmpi-pmix"):
        args = modules.by_name(name).podman_args()
        assert "--privileged" not in args and "--cap-drop=SYS_PTRACE" in args, name
        assert f"${PRIVATE_SHM}:/dev/shm" in modules.by_name(name).bind
    slurm = modules.by_name("slurm")
    assert slurm.bind and all(rule.endswith(":ro") for rule in slurm.bind)


def test_a_cached_module_set_equals_the_parsed_one_and_follows_changes(site, tmp_path):
    cache = tmp_path / "cache"
    first = ModuleSet.load(site.directory, cache_dir=str(cache))
    assert (cache / "modules-cache.json").exists()
    assert ModuleSet.load(site.directory, cache_dir=str(cache)) == first == site
    write_module(tmp_path, "b", "name: b\ncli_arg: beta\nenv: ENABLE_B\nhelp: changed help text\n")
    assert ModuleSet.load(site.directory, cache_dir=str(cache)).by_name("b").help == "changed help text"


def test_a_module_file_that_is_not_yaml_is_one_line_with_its_place(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nenv: X\nbind: [/a:/b\n")
    with pytest.raises(ModuleError) as refused:
        load_module(path)
    assert str(refused.value) == (
        f"module file {path} is not valid YAML: line 4, column 1: expected ',' or ']', but got '<stream end>'"
    )
