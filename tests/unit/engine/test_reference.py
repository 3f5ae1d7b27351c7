"""Image references."""

import pytest

from jupyter_podman_hpc.engine import reference
from jupyter_podman_hpc.engine.errors import InvalidReference
from jupyter_podman_hpc.engine.reference import candidate_names, parse, validate


@pytest.mark.parametrize(
    "text,name",
    [
        ("alpine", "localhost/alpine:latest"),
        ("127.0.0.1:5000/jph/base:bookworm", "127.0.0.1:5000/jph/base:bookworm"),
        ("docker.io/library/ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("user/image", "localhost/user/image:latest"),
    ],
)
def test_parse_gives_the_stored_name(text, name):
    assert parse(text).name == name


@pytest.mark.parametrize("text", ["", "UPPER/case", "a b", "img:tag;rm -rf /", "x\ny", " img", "img:"])
def test_invalid_references_are_rejected(text):
    with pytest.raises(InvalidReference):
        validate(text)


def test_candidate_names_follow_podman_hpc():
    assert candidate_names("alpine") == [
        "alpine:latest",
        "localhost/alpine:latest",
        "docker.io/alpine:latest",
        "docker.io/library/alpine:latest",
    ]
    assert candidate_names("127.0.0.1:5000/x:1") == ["127.0.0.1:5000/x:1"]


def test_a_transport_prefix_names_the_image_podman_stores():
    assert reference.normalize("docker://127.0.0.1:5000/jph/tiny:latest") == "127.0.0.1:5000/jph/tiny:latest"
    assert reference.normalize("containers-storage:localhost/x:1") == "localhost/x:1"
    assert reference.normalize("oci-archive:/tmp/x.tar") == "oci-archive:/tmp/x.tar"  # not a name: podman's
    assert reference.validate("docker://alpine") == "alpine"
    assert reference.parse("docker://a.io/b:1").name == "a.io/b:1"
    assert reference.candidate_names("docker://alpine")[0] == "alpine:latest"


def test_jobs_name_the_image_without_its_transport():
    from jupyter_podman_hpc.slurm.spec import JobSpec

    assert (
        JobSpec(image="docker://127.0.0.1:5000/jph/tiny:latest", command=["true"]).image
        == "127.0.0.1:5000/jph/tiny:latest"
    )
