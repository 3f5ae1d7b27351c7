"""Image references."""

import pytest

from jupyter_podman_hpc.engine.errors import InvalidReference
from jupyter_podman_hpc.engine.reference import candidate_names, parse, validate


@pytest.mark.parametrize("text,name", [
    ("alpine", "localhost/alpine:latest"),
    ("127.0.0.1:5000/jph/base:bookworm", "127.0.0.1:5000/jph/base:bookworm"),
    ("docker.io/library/ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
    ("user/image", "localhost/user/image:latest"),
])
def test_parse_gives_the_stored_name(text, name):
    assert parse(text).name == name


@pytest.mark.parametrize("text", ["", "UPPER/case", "a b", "img:tag;rm -rf /", "x\ny", " img", "img:"])
def test_invalid_references_are_rejected(text):
    with pytest.raises(InvalidReference):
        validate(text)


def test_candidate_names_follow_podman_hpc():
    assert candidate_names("alpine") == ["alpine:latest", "localhost/alpine:latest",
                                         "docker.io/alpine:latest", "docker.io/library/alpine:latest"]
    assert candidate_names("127.0.0.1:5000/x:1") == ["127.0.0.1:5000/x:1"]
