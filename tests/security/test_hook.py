"""The OCI hook against a hostile image: the image's own ``/sbin/ldconfig`` never runs outside
its container, and symlinks in the image never send a module's ``copy`` outside its root.

The attacker is the image's author; the victim (hpcuser) runs the image with a module that has
``copy`` entries. The hook runs in podman's user namespace, as the victim, with every capability
there and the host's file systems in view. The hostile image has:

- a ``/sbin/ldconfig`` that breaks out of the ``chroot`` the old hook ran it in (it has
  CAP_SYS_CHROOT) and writes a marker into a directory of the victim's on the host, and a second
  marker inside its own root;
- ``/opt/jphevil``, an absolute symlink to a host directory of the victim's, and ``/opt/jphrel``,
  a relative one climbing to it, as the destination directories of the module's copies.
"""

import uuid

from tests.helpers.site_modules import library_module

ESCAPING_LDCONFIG = """\
#!/usr/bin/python3
# A hostile image's ldconfig: leave the chroot the hook ran us in, then write on the host.
import os
with open("/ldconfig-ran", "w") as inside:
    inside.write("the image's ldconfig ran\\n")
os.makedirs("/.escape", exist_ok=True)
here = os.open("/", os.O_RDONLY)
os.chroot("/.escape")
os.fchdir(here)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
with open({marker!r}, "w") as outside:
    outside.write("the image's ldconfig ran outside its container\\n")
"""

HOSTILE = """\
FROM {base}
COPY ldconfig /sbin/ldconfig
RUN chmod 755 /sbin/ldconfig && mkdir -p /opt && ln -s {target} /opt/jphevil \\
    && ln -s ../../../../../../../../../../..{target} /opt/jphrel
"""


def module_dir(tmp_path):
    """A modules.d with one module whose copies go into /opt/jphevil/ and /opt/jphrel/."""
    return library_module(tmp_path, "jphevil", ["/opt/jphevil/", "/opt/jphrel/"], "/opt/jphevil")


def test_hostile_image_cannot_write_outside_its_root_through_the_hook(victim, stack, tmp_path):
    modules = module_dir(tmp_path)
    victim.env["PODMANHPC_MODULES_DIR"] = str(modules)
    precious = victim.work / "precious"  # a directory of the victim's on the host
    precious.mkdir()
    (precious / "notes.txt").write_text("mine\n")
    marker = victim.work / "ldconfig-ran-on-the-host"
    context = victim.work / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "ldconfig").write_text(ESCAPING_LDCONFIG.format(marker=str(marker)))
    (context / "Containerfile").write_text(HOSTILE.format(base=stack.base_image, target=precious))
    image = f"localhost/tests/hostile-ldconfig:{uuid.uuid4().hex[:6]}"
    victim("build", "-t", image, context)

    result = victim.sh(
        "podman-hpc",
        "run",
        "--rm",
        "--jphevil",
        image,
        "sh",
        "-c",
        f"ls /opt/jphevil/; ls /opt/jphrel/; ls {precious}; test -e /ldconfig-ran && echo RAN; true",
        check=False,
    )

    assert not marker.exists(), "the image's /sbin/ldconfig ran outside its container"
    assert sorted(p.name for p in precious.iterdir()) == ["notes.txt"], (
        "a copy followed the image's symlink onto the host"
    )
    assert (precious / "notes.txt").read_text() == "mine\n"
    assert result.returncode == 0, result.stderr
    # the copies landed inside the container's root, where its symlinks point there
    assert result.stdout.split() == ["libjphevil.so.1"] * 3, result.stdout
    assert "RAN" not in result.stdout, "the image's /sbin/ldconfig ran"

    # the normal flow: a plain image gets its copies and a library cache that lists them
    normal = victim.sh(
        "podman-hpc",
        "run",
        "--rm",
        "--jphevil",
        stack.base_image,
        "sh",
        "-c",
        "ls /opt/jphevil /opt/jphrel; cat /etc/ld.so.conf.d/jphevil.conf; ldconfig -p | grep -c libjphevil",
    )
    assert normal.stdout.split() == [
        "/opt/jphevil:",
        "libjphevil.so.1",
        "/opt/jphrel:",
        "libjphevil.so.1",
        "/opt/jphevil",
        "1",
    ], normal.stdout
