"""Kernel overlayfs: podman's mount options as kernel overlayfs options (the mount itself and
its probe run on the stack: tests/integration/engine/test_read_path.py)."""

from jupyter_podman_hpc.engine.mount.kerneloverlay import kernel_options


def test_podman_options_become_kernel_overlay_options_with_userxattr():
    options = ["lowerdir=l/A:l/B,upperdir=/g/x/diff,workdir=/g/x/work,,volatile"]
    assert (
        kernel_options(options, ["/c/a", "/c/b"])
        == "lowerdir=/c/a:/c/b,upperdir=/g/x/diff,workdir=/g/x/work,volatile,userxattr"
    )


def test_an_option_only_fuse_overlayfs_has_keeps_fuse_overlayfs():
    assert kernel_options(["lowerdir=l/A,upperdir=u,workdir=w,uidmapping=0:1000:1"], ["/c/a"]) is None
