"""The read path's settings as the mount program reads them, and the unpack cache's budget
(MiB, a share of the node's memory or of the job's memory cgroup, a login node's own)."""

import os
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.errors import ConfigError
from jupyter_podman_hpc.engine.site.config import load_config
from jupyter_podman_hpc.engine.site.readpath import ReadPathSettings, budget_mb, cgroup_limits, memory_bytes


def test_settings_travel_to_the_mount_program_through_podmans_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("squash_read_path: kernel\nsquash_unpack_max_mb: 512\n")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")  # a compute node's budget
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "16")
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB", "2048")
    config = load_config()
    settings = ReadPathSettings.from_env(config.podman_env({}))
    assert settings == ReadPathSettings(
        "kernel", f"/dev/shm/{os.getuid()}_hpc/unpacked", 512.0, 30.0, "1234", 16, 2048.0
    )
    assert settings.kernel_overlay and not settings.unpacks
    assert ReadPathSettings.from_env({}).mode == "auto"


def test_auto_declines_to_unpack_what_the_jobs_nodes_together_would_read_too_much_of():
    settings = ReadPathSettings("auto", "/dev/shm/x", 4096.0, 30.0, "7", job_nodes=16, auto_job_max_mb=2048.0)
    assert settings.auto_declines(128 * 2**20) == ""  # 16 x 128 MiB = the limit
    assert settings.auto_declines(129 * 2**20) == (
        "auto reads it through squashfuse: 16 nodes x 129 MiB would read 2064 MiB from the shared store, "
        "more than squash_unpack_auto_job_max_mb (2048)"
    )
    assert ReadPathSettings("unpacked", "/dev/shm/x", 4096.0, 30.0, "7", 16, 2048.0).auto_declines(2**30) == ""
    assert ReadPathSettings("auto", "/dev/shm/x", 4096.0, 30.0, None).auto_declines(2**40) == ""  # nodes unknown


def test_a_bad_auto_job_limit_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB", "-5")
    with pytest.raises(
        ConfigError,
        match=r"^squash_unpack_auto_job_max_mb \(env: PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB\) "
        "must be positive$",
    ):
        load_config()


def test_an_unknown_read_path_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_SQUASH_READ_PATH", "fastest")
    with pytest.raises(ConfigError, match=r"squash_read_path .* must be one of auto, unpacked, kernel, fuse"):
        load_config()


def test_the_budget_is_mib_or_a_share_of_memory():
    assert budget_mb("512") == 512.0 and budget_mb(0.5) == 0.5
    assert budget_mb("10%", memory=64 * 2**30) == 6553.6
    assert budget_mb(" 5% ", memory=2**30) == 51.2
    for bad in ("lots", "0", "-1", "0%", "150%", "%"):
        with pytest.raises(ValueError):
            budget_mb(bad, memory=2**30)


def test_the_default_budget_is_a_tenth_of_this_nodes_memory(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    config = load_config()
    assert config.squash_unpack_max_mb == "10%" and config.sources["squash_unpack_max_mb"] == "default"
    assert config.read_path.unpack_max_mb == round(memory_bytes() / 10 / 2**20, 1)
    assert 0 < memory_bytes() <= int(Path("/proc/meminfo").read_text().split()[1]) * 1024


def test_a_bad_budget_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_MAX_MB", "half")
    with pytest.raises(
        ConfigError,
        match=r"squash_unpack_max_mb \(env: PODMANHPC_SQUASH_UNPACK_MAX_MB\) must be "
        r"a positive number of MiB or a share of memory such as 10%, not 'half'",
    ):
        load_config()


def test_a_memory_cgroup_limit_below_the_nodes_memory_is_the_base(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "slurm" / "job_7" / "step_0").mkdir(parents=True)
    (v2 / "slurm" / "job_7" / "memory.max").write_text("8589934592\n")
    (v2 / "slurm" / "job_7" / "step_0" / "memory.max").write_text("max\n")
    (tmp_path / "cg2").write_text("0::/slurm/job_7/step_0\n")
    assert cgroup_limits(str(tmp_path / "cg2"), str(v2)) == [8589934592]
    v1 = tmp_path / "v1"
    (v1 / "memory" / "slurm" / "uid_1" / "job_7").mkdir(parents=True)
    (v1 / "memory" / "slurm" / "uid_1" / "job_7" / "memory.limit_in_bytes").write_text("4294967296\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cg1").write_text("9:pids:/\n4:memory:/slurm/uid_1/job_7\n")
    assert sorted(cgroup_limits(str(tmp_path / "cg1"), str(v1))) == [4294967296, 9223372036854771712]
    (tmp_path / "cg0").write_text("9:pids:/\n")
    assert cgroup_limits(str(tmp_path / "cg0"), str(v1)) == []


@pytest.mark.parametrize(
    "job, mode, unpacks",
    [
        ("", "auto", False),  # a login node: squashfuse's page cache, not a tmpfs copy
        ("", "unpacked", True),  # unless asked
        ("", "kernel", False),
        ("4242", "auto", True),  # a compute node in a job
        ("4242", "kernel", False),
    ],
)
def test_a_login_node_unpacks_only_when_asked(monkeypatch, tmp_path, job, mode, unpacks):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text(f"squash_read_path: {mode}\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    config = load_config()
    settings = ReadPathSettings.from_env(config.podman_env({}))  # as the mount program sees it
    assert (settings.job, settings.login_node, settings.unpacks) == (job, not job, unpacks)
    assert config.read_path.unpacks == unpacks


def test_a_mount_program_not_told_where_it_runs_unpacks_as_before():
    settings = ReadPathSettings.from_env({"PODMANHPC_SQUASH_UNPACK_DIR": "/dev/shm/x"})
    assert settings.job is None and settings.unpacks and settings.idle_minutes == 30.0


@pytest.mark.parametrize("job, budget", [("", 2048.0), ("99", None)])
def test_a_login_node_has_a_budget_of_its_own_when_asked_to_unpack(monkeypatch, tmp_path, job, budget):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("squash_read_path: unpacked\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    config = load_config()
    assert config.budget_key == (("squash_unpack_max_mb", "10%") if job else ("squash_unpack_login_max_mb", "2048"))
    expected = budget if budget is not None else round(memory_bytes() / 10 / 2**20, 1)
    assert ReadPathSettings.from_env(config.podman_env({})).unpack_max_mb == expected
