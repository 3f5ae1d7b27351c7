"""The provisioner's podman command line, configuration checks and error messages (no podman run)."""

import json
import socket
import sys

import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager
from tornado import web

from jupyter_podman_hpc.engine.errors import EngineError
from jupyter_podman_hpc.kernels import kernelspec
from jupyter_podman_hpc.kernels.container import BOOT, BOOT_IN_CONTAINER
from jupyter_podman_hpc.kernels.orphans import HOST_LABEL, LABEL, OWNER_LABEL, owner_token
from jupyter_podman_hpc.kernels.provisioner import KernelStartError, PodmanHPCProvisioner

IMAGE = "127.0.0.1:5000/jph/base:bookworm"
CMD = [sys.executable, "-m", "ipykernel_launcher", "-f", "/tmp/kernel-abc.json"]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """podman-hpc's settings pointing into a temporary directory."""
    monkeypatch.setenv("PODMANHPC_GRAPH_ROOT", str(tmp_path / "graph"))
    monkeypatch.setenv("PODMANHPC_RUN_ROOT", str(tmp_path / "run"))
    monkeypatch.setenv("PODMANHPC_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("SQUASH_DIR", str(tmp_path / "squash"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PODMANHPC_NETWORK", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path


def make(image=IMAGE, env=None, **config):
    spec_dict = kernelspec.kernel_json(image)
    spec = KernelSpec(
        argv=spec_dict["argv"], display_name="x", language="python", env=env or {}, interrupt_mode="message"
    )
    provisioner = PodmanHPCProvisioner(kernel_id="abc-123", kernel_spec=spec, parent=None, image=image, **config)
    provisioner._prepare_engine()
    provisioner.container_name = "podman-hpc-kernel-abc-123"
    provisioner.connection_info = {"transport": "tcp", "ip": "127.0.0.1", "hb_port": 1}
    return provisioner


def options_of(argv):
    """The podman run options (after "run", before the image)."""
    start = argv.index("run") + 1
    end = argv.index(IMAGE)
    return argv[start:end]


def pairs(options, flag):
    return [options[i + 1] for i, arg in enumerate(options[:-1]) if arg == flag]


def test_the_kernel_runs_with_podman_hpc_run_semantics(site):
    provisioner = make()
    cwd = site / "home" / "notebooks"
    cwd.mkdir()
    argv, env = provisioner.build_command(CMD, {"JPY_SESSION_NAME": "/nb.ipynb", "SECRET": "x"}, str(cwd))
    config = provisioner._podman.config
    assert argv[0] == config.podman_bin
    assert argv[argv.index("--root") + 1] == str(site / "graph")
    assert f"additionalimagestore={site / 'squash'}" in argv  # the squashed store
    options = options_of(argv)
    # ipykernel_launcher becomes our boot program (mounted read-only), same arguments
    assert argv[argv.index(IMAGE) + 1 :] == ["python3", BOOT_IN_CONTAINER, "-f", "/tmp/kernel-abc.json"]
    for flag in ("--rm", "--init", "--replace"):
        assert flag in options
    assert pairs(options, "--name") == ["podman-hpc-kernel-abc-123"]
    assert pairs(options, "--pull") == ["never"]
    assert pairs(options, "--network") == ["host"]
    assert "seccomp=unconfined" in options  # the site defaults
    labels = dict(label.split("=", 1) for label in pairs(options, "--label"))
    assert labels[LABEL] == "abc-123" and labels[OWNER_LABEL] == owner_token()
    assert labels[HOST_LABEL] == socket.gethostname()
    home = str(site / "home")
    assert pairs(options, "--volume") == [f"{home}:{home}", f"{BOOT}:{BOOT_IN_CONTAINER}:ro"]  # cwd is in $HOME
    assert pairs(options, "--workdir") == [str(cwd)]
    assert "--userns" not in options  # the image is not in node-local storage
    # values reach podman through its environment, never its command line
    assert [name for name in pairs(options, "--env") if "=" not in name] == ["HOME", "JPY_SESSION_NAME"]
    assert env["JPY_SESSION_NAME"] == "/nb.ipynb" and env["HOME"] == home
    assert not any("/nb.ipynb" in arg or "SECRET" in arg for arg in argv)


def test_kernelspec_env_is_passed_and_parent_pid_is_not(site):
    provisioner = make(env={"MY_VAR": "1"})
    argv, env = provisioner.build_command(
        CMD,
        {
            "MY_VAR": "value",
            "JPY_PARENT_PID": "77",
            "JPY_API_TOKEN": "t",
            "JPY_SESSION_NAME": "nb",
            "KERNEL_USERNAME": "u",
        },
        None,
    )
    passed = pairs(options_of(argv), "--env")
    assert "MY_VAR" in passed and env["MY_VAR"] == "value"
    assert "JPY_PARENT_PID" not in passed and "JPY_API_TOKEN" not in passed
    assert "JPY_SESSION_NAME" in passed and "KERNEL_USERNAME" in passed  # what the server passes
    assert pairs(options_of(argv), "--workdir") == [str(site / "home")]


def test_connection_file_is_mounted_alone_unless_ipc(site):
    runtime = site / "runtime"
    runtime.mkdir()
    connection_file = str(runtime / "kernel-abc.json")
    provisioner = make()

    def volumes() -> list[str]:
        found = pairs(options_of(provisioner.build_command(CMD, {}, None)[0]), "--volume")
        return [volume for volume in found if not volume.startswith(f"{BOOT}:")]

    provisioner.parent = KernelManager(connection_file=connection_file)
    home = str(site / "home")
    assert volumes() == [f"{home}:{home}", f"{connection_file}:{connection_file}"]
    provisioner.connection_info = {"transport": "ipc", "ip": str(runtime / "kernel"), "hb_port": 1}
    assert volumes() == [f"{home}:{home}", f"{runtime}:{runtime}"]  # ipc sockets live beside the file
    provisioner.parent = KernelManager(connection_file=str(site / "home" / "kernel-abc.json"))
    assert volumes() == [f"{home}:{home}"]


def test_modules_add_their_arguments_without_a_second_network(site):
    provisioner = make(modules=["jupyter"])  # the site module brings --network=host itself
    options = options_of(provisioner.build_command(CMD, {}, None)[0])
    assert "--network=host" in options and "--network" not in options
    assert "MOUNT_JUPYTER=1" in options


def test_a_network_other_than_host_is_refused(site):
    provisioner = make(podman_args=["--network", "bridge"])
    with pytest.raises(KernelStartError, match="needs the host network"):
        provisioner.build_command(CMD, {}, None)


def test_podman_args_go_before_the_image(site):
    provisioner = make(podman_args=["--shm-size=1g"])
    argv = provisioner.build_command(CMD, {}, None)[0]
    assert argv.index("--shm-size=1g") < argv.index(IMAGE)


def test_keep_id_auto_follows_the_image_location(site):
    assert "--userns" not in make().build_command(CMD, {}, None)[0]
    images = site / "graph" / "overlay-images"
    images.mkdir(parents=True)
    (images / "images.json").write_text(json.dumps([{"id": "f" * 64, "names": [IMAGE]}]))
    options = options_of(make().build_command(CMD, {}, None)[0])
    assert pairs(options, "--userns") == ["keep-id"]
    assert "--userns" not in make(keep_id="false").build_command(CMD, {}, None)[0]
    assert "--userns" not in make(keep_id=False).build_command(CMD, {}, None)[0]  # JSON false
    (images / "images.json").write_text("[]")
    assert "--userns" in make(keep_id="true").build_command(CMD, {}, None)[0]
    with pytest.raises(KernelStartError, match="keep_id must be"):
        make(keep_id="sometimes").build_command(CMD, {}, None)


def test_keep_id_auto_is_off_when_the_local_image_is_also_squashed(site):
    """The mount program reads a pulled image (local and squashed) from its squash file, where keep-id
    cannot work here; an image only in local storage (built on the login node) keeps it."""
    local, other = "f" * 64, "e" * 64
    images = site / "graph" / "overlay-images"
    images.mkdir(parents=True)
    (images / "images.json").write_text(json.dumps([{"id": local, "names": [IMAGE]}]))
    squashed = site / "squash" / "overlay-images"
    squashed.mkdir(parents=True)
    (squashed / "images.json").write_text(json.dumps([{"id": other, "names": ["x/other:1"]}]))
    assert pairs(options_of(make().build_command(CMD, {}, None)[0]), "--userns") == ["keep-id"]
    (squashed / "images.json").write_text(json.dumps([{"id": local, "names": [IMAGE]}]))
    assert "--userns" not in make().build_command(CMD, {}, None)[0]
    assert "--userns" in make(keep_id="true").build_command(CMD, {}, None)[0]  # asked for: kept


def test_config_errors_are_messages(site):
    with pytest.raises(KernelStartError, match="unknown key 'imgae'"):
        PodmanHPCProvisioner(kernel_id="k", imgae=IMAGE)
    with pytest.raises(KernelStartError, match=r"invalid kernel_provisioner config.*modules"):
        PodmanHPCProvisioner(kernel_id="k", image=IMAGE, modules=3)
    with pytest.raises(KernelStartError, match="names no image"):
        make(image="")
    with pytest.raises(KernelStartError, match="invalid image reference"):
        make(image="Not Valid")
    with pytest.raises(KernelStartError, match="unknown module 'nosuch'"):
        make(modules=["nosuch"])


def test_start_errors_are_engine_errors_without_web_types():
    error = KernelStartError("image X has no ipykernel: install it or choose another image")
    assert isinstance(error, EngineError) and not isinstance(error, web.HTTPError)
    assert str(error) == "image X has no ipykernel: install it or choose another image"


@pytest.mark.parametrize(
    "code, stderr, expected",
    [
        (125, ["Error: 127.0.0.1:5000/jph/base:bookworm: image not known"], "is not on this node"),
        (1, ["/usr/bin/python3: No module named ipykernel_launcher"], "has no ipykernel: install it or choose"),
        (127, ['Error: runc: exec: "python3": executable file not found in $PATH'], "(python3 is not in the image)"),
        (1, ["ERROR (catatonit:6): failed to exec pid1: No such file or directory"], "(python3 is not in the image)"),
        (126, ["Error: creating /etc/mtab symlink: operation not supported"], "set keep_id to false"),
        (3, ["Traceback ...", "ValueError: boom"], "exited before the kernel started: ValueError: boom"),
        (3, [], "exit code 3"),
    ],
)
def test_early_exits_are_explained(site, code, stderr, expected):
    provisioner = make()
    provisioner._program = "python3"
    message = provisioner.explain_exit(code, stderr)
    assert expected in message and IMAGE in message
