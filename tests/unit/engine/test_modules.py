"""Site modules: the schema, conflicts and dependencies, bind rules, the shipped modules."""

import pytest

from jupyter_podman_hpc.engine.config import SITE_DATA
from jupyter_podman_hpc.engine.errors import ModuleError
from jupyter_podman_hpc.engine.modules import ModuleSet, cdi_kind_available, resolve_binds


def write_module(directory, name, text):
    (directory / f"{name}.yaml").write_text(text)


@pytest.fixture
def site(tmp_path):
    write_module(tmp_path, "a", "name: a\ncli_arg: alpha\nenv: ENABLE_A\nconflicts: [b]\n"
                 "additional_args: ['-e SLURM_*', '--ipc=host']\n")
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
    pairs = resolve_binds([f"{tmp_path}/libnv*:/usr/lib64/", "$HOME:$HOME", "/does/not/exist:/x",
                           "$UNSET_VARIABLE:/y"], "/modules", env)
    assert (f"{tmp_path}/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1") in pairs
    assert (f"{tmp_path}/libnvcuvid.so.1", "/usr/lib64/libnvcuvid.so.1") in pairs
    assert (str(tmp_path), str(tmp_path)) in pairs
    assert len(pairs) == 3  # missing sources and unset variables mount nothing


def test_relative_sources_are_relative_to_the_modules_directory():
    pairs = resolve_binds(["../01-gpu.conf:/etc/ld.so.conf.d/02-gpu.conf"], str(SITE_DATA / "modules.d"), {})
    assert pairs == [(str(SITE_DATA / "01-gpu.conf"), "/etc/ld.so.conf.d/02-gpu.conf")]


def test_cdi_device_only_when_a_spec_declares_it(tmp_path):
    assert not cdi_kind_available("nvidia.com/gpu", [str(tmp_path)])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert cdi_kind_available("nvidia.com/gpu", [str(tmp_path)])


def test_shipped_modules_load_and_the_mpi_ones_conflict(tmp_path):
    modules = ModuleSet.load(str(SITE_DATA / "modules.d"))
    assert {"gpu", "openmpi-pmix", "openmpi-pmi2", "mpich", "jupyter", "home", "scratch"} <= \
        {m.name for m in modules}
    with pytest.raises(ModuleError, match="conflicts"):
        modules.select(["openmpi-pmix", "openmpi-pmi2"])
    jupyter = modules.podman_args(modules.select(["jupyter"]), {"HOME": str(tmp_path)})
    assert "--network=host" in jupyter and f"{tmp_path}:{tmp_path}" in jupyter and "/tmp:/tmp" in jupyter


def test_a_cached_module_set_equals_the_parsed_one_and_follows_changes(site, tmp_path):
    cache = tmp_path / "cache"
    first = ModuleSet.load(site.directory, cache_dir=str(cache))
    assert (cache / "modules-cache.json").exists()
    assert ModuleSet.load(site.directory, cache_dir=str(cache)) == first == site
    write_module(tmp_path, "b", "name: b\ncli_arg: beta\nenv: ENABLE_B\nhelp: changed help text\n")
    assert ModuleSet.load(site.directory, cache_dir=str(cache)).by_name("b").help == "changed help text"
