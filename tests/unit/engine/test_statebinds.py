"""The engine's state kept out of containers (engine/statebinds.py): --ipc=host gets the user's own
/dev/shm, a bind that would reach a state directory is refused in one line."""

import pytest

from jupyter_podman_hpc.engine.errors import InvalidInput
from jupyter_podman_hpc.engine.podman import Podman, option_values, parse_options
from jupyter_podman_hpc.engine.site.config import load_config
from jupyter_podman_hpc.engine.site.modules import PRIVATE_SHM
from jupyter_podman_hpc.engine.statebinds import binds, guard, host_pid_with_ptrace, reached_state

HELP = """\
Options:
      --cap-add stringArray   Add capabilities to the container
      --cap-drop stringArray  Drop capabilities from the container
      --ipc string            IPC namespace to use
      --mount stringArray     Attach a filesystem mount to the container
      --pid string            PID namespace to use
      --privileged            Give extended privileges to container
      --rm                    Remove container after exit
      --tmpfs tmpfs           Mount a temporary filesystem
  -i, --interactive           Keep STDIN open even if not attached
  -v, --volume stringArray    Bind mount a volume
"""
TABLE = parse_options(HELP)


@pytest.fixture
def site(tmp_path):
    """A configuration whose state directories are all under tmp_path (shm/ stands for /dev/shm)."""
    environ = {
        "PODMANHPC_GRAPH_ROOT": f"{tmp_path}/tmp/hpc/storage",
        "PODMANHPC_RUN_ROOT": f"{tmp_path}/tmp/hpc",
        "PODMANHPC_CONFIG_HOME": f"{tmp_path}/tmp/hpc/config",
        "PODMANHPC_SQUASH_UNPACK_DIR": f"{tmp_path}/shm/hpc/unpacked",
        PRIVATE_SHM: f"{tmp_path}/shm/hpc/ipc",
    }
    config = load_config(environ)
    config.prepare_state()
    return config, environ


def given(*words):
    return option_values(list(words), TABLE)


@pytest.mark.parametrize(
    "words",
    [
        ["-v", "{shm}:/dev/shm"],
        ["-v{shm}:/dev/shm"],
        ["-v={shm}:/x"],
        ["--volume={tmp}:/tmp:ro"],
        ["-iv", "{shm}/hpc:/x"],
        ["--mount", "type=bind,src={shm},dst=/dev/shm"],
        ["--mount=type=bind,source={shm}/hpc/unpacked/abc/etc,target=/etc2"],
        ["--mount", "type=glob,src={shm}/*,dst=/x"],
        ["-v", "/:/host"],
        # beside the unpacked copies (their parent is the user's own): the checked squash files, the mounts
        ["-v", "{shm}/hpc/squash-verified:/x"],
        ["-v", "{shm}/hpc/squash-mounts/123:/x"],
    ],
)
def test_a_bind_that_reaches_engine_state_is_refused_in_one_line(site, tmp_path, words):
    config, environ = site
    words = [w.format(shm=tmp_path / "shm", tmp=tmp_path / "tmp") for w in words]
    with pytest.raises(InvalidInput) as refused:
        guard(config, given(*words), environ)
    message = str(refused.value)
    assert "\n" not in message and "would give the container podman-hpc's own state (" in message
    assert "bind a directory of your own" in message


def test_the_message_names_the_option_and_the_outermost_state_directory(site, tmp_path):
    config, environ = site
    with pytest.raises(
        InvalidInput,
        match=rf"^-v {tmp_path}/tmp:/tmp would give the container podman-hpc's "
        rf"own state \({tmp_path}/tmp/hpc\): ",
    ):
        guard(config, given("-v", f"{tmp_path}/tmp:/tmp"), environ)


def test_a_link_to_state_is_judged_by_its_target(site, tmp_path):
    config, environ = site
    (tmp_path / "innocent").symlink_to(tmp_path / "shm")
    with pytest.raises(InvalidInput):
        guard(config, given("-v", f"{tmp_path}/innocent:/data"), environ)


def test_binds_beside_the_state_and_named_volumes_pass(site, tmp_path):
    config, environ = site
    (tmp_path / "data").mkdir()
    ok = given(
        "-v",
        f"{tmp_path}/data:/data",
        "-v",
        "named:/x",
        "-v",
        "/anonymous",
        "--mount",
        "type=volume,src=cache,dst=/cache",
        "--mount",
        "type=tmpfs,dst=/scratch",
        "-v",
        f"{tmp_path}/shm/hpc/ipc:/dev/shm",
        "--rm",
    )
    assert guard(config, ok, environ) == []


def test_host_ipc_gets_the_users_own_shm_unless_something_is_mounted_there(site, tmp_path):
    config, environ = site
    own = f"{tmp_path}/shm/hpc/ipc"
    for words in (["--ipc=host"], ["--ipc", "host"]):
        assert guard(config, given(*words), environ) == ["-v", f"{own}:/dev/shm"]
    assert (tmp_path / "shm" / "hpc" / "ipc").stat().st_mode & 0o777 == 0o700
    (tmp_path / "mine").mkdir()
    for mine in (
        ["-v", f"{tmp_path}/mine:/dev/shm/"],
        ["--tmpfs", "/dev/shm:size=1g"],
        ["--mount", f"type=bind,src={tmp_path}/mine,dst=/dev/shm"],
    ):
        assert guard(config, given("--ipc=host", *mine), environ) == []
    assert guard(config, given("--ipc=private"), environ) == []


def test_the_users_own_shm_is_no_way_around_the_check(site, tmp_path):
    config, environ = site
    with pytest.raises(InvalidInput, match=r"^-v .*/shm/hpc/unpacked/ipc:/dev/shm would give"):
        guard(config, given("--ipc=host"), {**environ, PRIVATE_SHM: f"{tmp_path}/shm/hpc/unpacked/ipc"})


def test_what_binds_and_reached_state_read():
    assert binds([("-v", "./x:/y:ro"), ("--tmpfs", "/t:size=1"), ("-e", "A=1")])[1:] == [
        ("--tmpfs /t:size=1", "", "/t")
    ]
    assert binds([("-v", "./x:/y:ro")])[0].source.endswith("/x")
    assert reached_state("/a", ["/a/b", "/a/b/c"]) == "/a/b"
    assert reached_state("/a/b/c/d", ["/a/b", "/a/b/c"]) == "/a/b"
    assert reached_state("/a/bc", ["/a/b"]) == ""


def test_every_run_the_podman_builder_makes_is_guarded(site, tmp_path):
    config, environ = site
    podman = Podman(config, environ)
    argv = podman.run_command(["--ipc=host", "img", "sh", "-c", "-v /dev/shm:/dev/shm"], ["-e", "M=1"])
    assert argv[argv.index("run") : argv.index("img")].count("-v") == 1  # ours; the command's words are not options
    assert f"{tmp_path}/shm/hpc/ipc:/dev/shm" in argv
    with pytest.raises(InvalidInput):
        podman.run_command(["img"], ["-v", f"{tmp_path}/shm:/dev/shm"])  # a module's bind too
    # the CLI's passthrough: podman-hpc create, container run, build (a Containerfile's RUN steps)
    with pytest.raises(InvalidInput):
        podman.command("create", "-v", f"{tmp_path}/shm:/dev/shm", "img")
    own = ["-v", f"{tmp_path}/shm/hpc/ipc:/dev/shm"]
    run = podman.command("container", "run", "--ipc", "host", "img")
    assert run[run.index("container") :] == ["container", "run", *own, "--ipc", "host", "img"]
    build = podman.command("build", "--ipc=host", str(tmp_path))
    assert build[build.index("build") :] == ["build", *own, "--ipc=host", str(tmp_path)]
    assert "-v" not in podman.command(["image", "inspect"], "img")


@pytest.mark.parametrize(
    "words",
    [
        ["--pid=host", "--privileged"],
        ["--pid", "host", "--cap-add", "SYS_PTRACE"],
        ["--pid=host", "--cap-add=all"],
        ["--pid=host", "--cap-add=net_admin,cap_sys_ptrace"],
        ["--pid=host", "--cap-drop=all", "--cap-add=SYS_PTRACE"],
    ],
)
def test_host_pid_with_ptrace_is_refused_in_one_line(site, words):
    config, environ = site
    with pytest.raises(InvalidInput, match=r"^--pid=host with SYS_PTRACE .* drop one of them") as refused:
        guard(config, given(*words), environ)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "words",
    [
        ["--pid=host"],
        ["--pid=host", "--cap-add=all", "--cap-drop=SYS_PTRACE"],  # the MPI modules
        ["--pid=host", "--privileged", "--cap-drop=sys_ptrace"],
        ["--privileged"],
        ["--cap-add=SYS_PTRACE"],
        ["--pid=host", "--cap-add=all", "--cap-drop=all"],
        ["--pid=private", "--privileged"],
    ],
)
def test_host_pid_without_ptrace_or_ptrace_in_its_own_pid_namespace_passes(site, words):
    config, environ = site
    assert not host_pid_with_ptrace(given(*words))
    assert guard(config, given(*words), environ) == []
