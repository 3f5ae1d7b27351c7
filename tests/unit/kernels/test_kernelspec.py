"""Kernelspecs of container kernels: contents, names, install/list/remove in a temporary prefix,
and which ones may start by themselves."""

import json
import os
import re
import threading
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_podman_hpc.engine.errors import InvalidReference, ModuleError
from jupyter_podman_hpc.kernels import PROVISIONER_NAME, kernelspec
from jupyter_podman_hpc.kernels.kernelspec import KernelSpecError

IMAGE = "127.0.0.1:5000/jph/base:bookworm"


def test_kernel_json_runs_the_image_ipykernel_through_the_provisioner():
    spec = kernelspec.kernel_json(IMAGE, modules=["gpu"], podman_args=["--shm-size=1g"])
    assert spec["argv"] == ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    assert spec["language"] == "python"
    assert spec["display_name"] == f"Python (podman-hpc: {IMAGE})"
    assert spec["interrupt_mode"] == "message"
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner == {
        "provisioner_name": PROVISIONER_NAME,
        "config": {"image": IMAGE, "modules": ["gpu"], "podman_args": ["--shm-size=1g"]},
    }


def test_install_writes_a_standard_kernelspec_with_logo(prefix):
    kernel = kernelspec.install(IMAGE, name="base", prefix=prefix)
    directory = prefix / "share" / "jupyter" / "kernels" / "base"
    assert kernel.path == str(directory) and kernel.image == IMAGE and kernel.modules == []
    assert sorted(p.name for p in directory.iterdir()) == ["kernel.json", "logo-svg.svg"]
    assert (directory / "logo-svg.svg").read_text().lstrip().startswith("<svg")
    spec = json.loads((directory / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"] == {"image": IMAGE}
    # Jupyter itself reads it, with our provisioner and the logo as a resource
    found = KernelSpecManager().get_all_specs()["base"]
    assert found["spec"]["metadata"]["kernel_provisioner"]["provisioner_name"] == PROVISIONER_NAME
    assert os.path.exists(os.path.join(found["resource_dir"], "logo-svg.svg"))
    assert not [p for p in (prefix / "share" / "jupyter").iterdir() if p.name.startswith(".podman-hpc-kernel-")]


def test_default_name_and_display_name_come_from_the_image(prefix):
    kernel = kernelspec.install(IMAGE, prefix=prefix)
    assert kernel.name == "podman-hpc-127.0.0.1-5000-jph-base-bookworm"
    assert kernel.display_name == f"Python (podman-hpc: {IMAGE})"
    custom = kernelspec.install(IMAGE, name="mine", display_name="My env", prefix=prefix)
    assert custom.display_name == "My env"


def test_user_install_goes_to_the_jupyter_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_PATH", "")
    kernel = kernelspec.install(IMAGE, name="user-kernel")
    assert kernel.path == str(tmp_path / "data" / "kernels" / "user-kernel")
    assert [k.name for k in kernelspec.list_kernels()] == ["user-kernel"]


@pytest.mark.parametrize("name", ["Base", "has space", "", "-dash", ".hidden", "a/b", "x" * 129, "über"])
def test_invalid_names_are_refused(prefix, name):
    with pytest.raises(KernelSpecError, match="invalid kernel name"):
        kernelspec.install(IMAGE, name=name, prefix=prefix)
    assert not (prefix / "share" / "jupyter" / "kernels").exists() or not list(
        (prefix / "share" / "jupyter" / "kernels").iterdir()
    )


@pytest.mark.parametrize("name", ["a", "base-1.0_x", "0", "x" * 128])
def test_valid_names(name):
    assert kernelspec.validate_name(name) == name


def test_invalid_image_reference_is_refused(prefix):
    with pytest.raises(InvalidReference):
        kernelspec.install("Not An Image", prefix=prefix)
    with pytest.raises(InvalidReference):
        kernelspec.install("registry/UPPER:tag", name="x", prefix=prefix)


def test_unknown_module_is_refused(prefix):
    with pytest.raises(ModuleError, match="unknown module 'nosuch'"):
        kernelspec.install(IMAGE, name="m", modules=["nosuch"], prefix=prefix)
    kernel = kernelspec.install(IMAGE, name="m", modules=["gpu", "scratch"], prefix=prefix)
    assert kernel.modules == ["gpu", "scratch"]


def test_conflicting_modules_are_refused(prefix):
    with pytest.raises(ModuleError, match="conflicts"):
        kernelspec.install(IMAGE, name="m", modules=["mpi", "openmpi-pmix"], prefix=prefix)


def test_bad_display_name_and_interrupt_mode(prefix):
    with pytest.raises(KernelSpecError, match="display name"):
        kernelspec.install(IMAGE, name="d", display_name="two\nlines", prefix=prefix)
    with pytest.raises(KernelSpecError, match="interrupt mode"):
        kernelspec.install(IMAGE, name="d", interrupt_mode="never", prefix=prefix)


def test_install_list_remove_round_trip(prefix):
    kernelspec.install(IMAGE, name="one", prefix=prefix)
    kernelspec.install("127.0.0.1:5000/jph/tiny:latest", name="two", modules=["home"], prefix=prefix)
    listed = {k.name: k for k in kernelspec.list_kernels(prefix)}
    assert sorted(listed) == ["one", "two"]
    assert listed["two"].image == "127.0.0.1:5000/jph/tiny:latest" and listed["two"].modules == ["home"]
    removed = kernelspec.remove("one", prefix)
    assert removed.name == "one" and not os.path.exists(removed.path)
    assert [k.name for k in kernelspec.list_kernels(prefix)] == ["two"]
    with pytest.raises(KernelSpecError, match="no podman-hpc kernel named one"):
        kernelspec.remove("one", prefix)


def test_reinstall_replaces_in_place(prefix):
    kernelspec.install(IMAGE, name="k", prefix=prefix)
    kernelspec.install("127.0.0.1:5000/jph/tiny:latest", name="k", prefix=prefix)
    [kernel] = kernelspec.list_kernels(prefix)
    assert kernel.image == "127.0.0.1:5000/jph/tiny:latest"
    leftovers = [p.name for p in (prefix / "share" / "jupyter").iterdir() if p.name != "kernels"]
    assert leftovers in ([], [".podman-hpc-kernels.lock"])


def test_other_kernels_are_neither_listed_nor_replaced_nor_removed(prefix):
    other = prefix / "share" / "jupyter" / "kernels" / "python-local"
    other.mkdir(parents=True)
    (other / "kernel.json").write_text(
        json.dumps(
            {
                "argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python",
                "language": "python",
            }
        )
    )
    assert kernelspec.list_kernels(prefix) == []
    with pytest.raises(KernelSpecError, match="not a podman-hpc kernel"):
        kernelspec.install(IMAGE, name="python-local", prefix=prefix)
    with pytest.raises(KernelSpecError, match="no podman-hpc kernel named python-local"):
        kernelspec.remove("python-local", prefix)
    assert json.loads((other / "kernel.json").read_text())["display_name"] == "Python"


def test_concurrent_installs_leave_one_complete_kernelspec(prefix):
    images = [f"127.0.0.1:5000/jph/img{i}:latest" for i in range(8)]
    errors = []

    def install(image):
        try:
            kernelspec.install(image, name="same", prefix=prefix)
        except Exception as err:  # noqa: BLE001  pragma: no cover - any error of a thread is reported below
            errors.append(err)

    threads = [threading.Thread(target=install, args=(image,)) for image in images]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    [kernel] = kernelspec.list_kernels(prefix)
    assert kernel.image in images
    directory = prefix / "share" / "jupyter" / "kernels" / "same"
    assert sorted(p.name for p in directory.iterdir()) == ["kernel.json", "logo-svg.svg"]


def test_a_failed_write_leaves_the_old_kernelspec(prefix, monkeypatch):
    kernelspec.install(IMAGE, name="k", prefix=prefix)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernelspec, "_put", broken)
    with pytest.raises(KernelSpecError, match="No space left on device"):
        kernelspec.install("127.0.0.1:5000/jph/tiny:latest", name="k", prefix=prefix)
    [kernel] = kernelspec.list_kernels(prefix)
    assert kernel.image == IMAGE
    assert not [p for p in (prefix / "share" / "jupyter").iterdir() if p.name.startswith(".podman-hpc-kernel-")]


def test_unwritable_location_is_a_message(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(KernelSpecError, match="cannot write the kernelspec"):
            kernelspec.install(IMAGE, name="k", prefix=locked)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"argv": ["python3"', "is not valid JSON (line 1, column 20): fix or remove it"),
        ("[1, 2]", "is not a JSON object: fix or remove it"),
        (
            json.dumps(
                {
                    "metadata": {
                        "kernel_provisioner": {"provisioner_name": "podman-hpc-provisioner", "config": "nonsense"}
                    }
                }
            ),
            ": metadata.kernel_provisioner.config is not an object: install it again",
        ),
    ],
)
def test_a_broken_kernelspec_is_one_problem_and_the_others_are_listed(prefix, text, why):
    kernelspec.install(IMAGE, name="good", prefix=prefix)
    broken = kernelspec.install(IMAGE, name="broken", prefix=prefix)
    (Path(broken.path) / "kernel.json").write_text(text)
    problems = []
    assert [k.name for k in kernelspec.list_kernels(prefix, problems)] == ["good"]
    assert (
        len(problems) == 1 and problems[0].startswith(f"kernelspec {broken.path}/kernel.json") and why in problems[0]
    ), problems
    assert [k.name for k in kernelspec.list_kernels(prefix)] == ["good"]  # without a list: still no error
    assert kernelspec.install(IMAGE, name="broken", prefix=prefix).image == IMAGE  # the retry replaces it
    assert [k.name for k in kernelspec.list_kernels(prefix, problems)] == ["broken", "good"]


def _group_writable_file(kernel):
    os.chmod(Path(kernel.path) / "kernel.json", 0o664)
    return "kernel.json is .* -rw-rw-r--: others may write to it"


def _group_writable_directory(kernel):
    os.chmod(kernel.path, 0o2775)
    return f"{kernel.path} is .* drwxrwsr-x: others may write into it"


def _link_into_a_shared_directory(kernel):
    shared = Path(kernel.path).parent.parent / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    spec_file = Path(kernel.path) / "kernel.json"
    os.replace(spec_file, shared / "kernel.json")
    spec_file.symlink_to(shared / "kernel.json")
    return f"{shared} is .* drwxrwxrwx: others may write into it"


def _missing(kernel):
    os.unlink(Path(kernel.path) / "kernel.json")
    return "kernel.json: No such file or directory"


@pytest.mark.parametrize(
    "make_untrusted", [_group_writable_file, _group_writable_directory, _link_into_a_shared_directory, _missing]
)
def test_only_a_kernelspec_nobody_else_could_write_may_start_by_itself(prefix, make_untrusted):
    own = kernelspec.install(IMAGE, name="own", prefix=prefix)
    assert kernelspec.check_trusted(own.path) == Path(own.path) / "kernel.json"
    why = make_untrusted(own)
    with pytest.raises(kernelspec.UntrustedKernelSpec) as caught:
        kernelspec.check_trusted(own.path)
    message = str(caught.value)
    assert message.startswith(f"kernelspec {own.path}/kernel.json starts only when picked: ")
    assert re.search(why, message) and "\n" not in message, message
