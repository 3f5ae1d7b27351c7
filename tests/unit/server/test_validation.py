"""What the REST API refuses, checked on the validation functions themselves: each bad value
is a BadRequest with its status and one sentence (tests/integration/server/test_api.py keeps
one such request through a live server)."""

from types import SimpleNamespace

import pytest

from jupyter_podman_hpc.server import validation as v


def refused(call, *args, **kwargs) -> v.BadRequest:
    with pytest.raises(v.BadRequest) as caught:
        call(*args, **kwargs)
    return caught.value


def request(body: bytes | str | None) -> SimpleNamespace:
    return SimpleNamespace(body=body.encode() if isinstance(body, str) else body)


def test_json_body_is_one_object_no_larger_than_the_limit():
    assert v.json_body(request('{"image": "x"}')) == {"image": "x"}
    assert v.json_body(request(None)) == {} and v.json_body(request(b"")) == {}
    too_big = refused(v.json_body, request(b"x" * (v.MAX_BODY_BYTES + 1)))
    assert too_big.status_code == 413 and str(v.MAX_BODY_BYTES) in too_big.message
    assert refused(v.json_body, request("not json")).message == "the request body is not valid JSON"
    assert refused(v.json_body, request("[1, 2]")).message == "the request body must be a JSON object"
    assert refused(v.json_body, request('{"a": 1}'), limit=3).status_code == 413


@pytest.mark.parametrize("value", ["Not A Reference", "ok:tag\nrm -rf /", "bad image"])
def test_an_image_must_be_a_valid_reference(value):
    error = refused(v.image, {"image": value})
    assert error.status_code == 400 and "invalid image reference" in error.message


def test_an_image_is_required_and_a_good_one_passes():
    assert refused(v.image, {}).message == "'image' is required"
    assert refused(v.image, {"tag": ""}, "tag").message == "'tag' is required"
    assert v.image({"image": "localhost/x:1"}) == "localhost/x:1"


def test_strings_are_strings_of_bounded_length_without_nul():
    assert v.string({}, "path", required=False, default="d") == "d"
    assert refused(v.string, {"path": 3}, "path").message == "'path' must be a string"
    long = refused(v.string, {"containerfile": "FROM x\n" * 5000}, "containerfile", max_length=30_000)
    assert long.message == "'containerfile' is longer than 30000 characters"
    assert refused(v.string, {"name": "x" * 4097}, "name").message == "'name' is longer than 4096 characters"
    assert "NUL" in refused(v.string, {"name": "a\0b"}, "name").message
    assert v.string({"name": "ok"}, "name") == "ok"


def test_booleans_are_json_booleans():
    assert v.boolean({}, "squash", True) is True and v.boolean({"squash": False}, "squash", True) is False
    assert refused(v.boolean, {"squash": "yes"}, "squash", False).message == "'squash' must be true or false"


@pytest.mark.parametrize(
    "value, words",
    [
        (0, "between 1 and 4, not 0"),
        (5, "between 1 and 4, not 5"),
        (True, "whole number"),
        ("2", "whole number"),
        (1.5, "whole number"),
    ],
)
def test_integers_are_whole_numbers_in_range(value, words):
    assert words in refused(v.integer, {"nodes": value}, "nodes", low=1, high=4).message


def test_an_integer_in_range_or_its_default_passes():
    assert v.integer({"nodes": 4}, "nodes", low=1, high=4) == 4
    assert v.integer({}, "pool", default=0, low=0, high=8) == 0
    assert "whole number" in refused(v.integer, {}, "nodes", low=1, high=4).message  # no default: required


def test_string_maps_hold_strings_without_newlines():
    assert v.string_map({"environment": {"A": "1"}}, "environment") == {"A": "1"}
    assert v.string_map({}, "environment") == {}
    assert "newline" in refused(v.string_map, {"environment": {"A": "1\nB"}}, "environment").message
    assert "newline" in refused(v.string_map, {"environment": {"A\0": "1"}}, "environment").message
    assert (
        refused(v.string_map, {"parameters": {"size": 3}}, "parameters").message
        == "'parameters' must be an object of strings"
    )
    assert "object of strings" in refused(v.string_map, {"parameters": ["a"]}, "parameters").message


def test_string_lists_hold_strings():
    assert v.string_list({"command": ["true"]}, "command") == ["true"] and v.string_list({}, "modules") == []
    assert refused(v.string_list, {"command": "true"}, "command").message == "'command' must be a list of strings"
    assert "list of strings" in refused(v.string_list, {"modules": ["a", 1]}, "modules").message


def test_paths_stay_inside_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "Containerfile").write_text("FROM scratch\n")
    (root / "escape").symlink_to(outside)
    assert v.inside_root(str(root), "sub/Containerfile", "path") == root.resolve() / "sub" / "Containerfile"
    assert v.inside_root(str(root), "", "context") == root.resolve()
    for relative in ("../etc/passwd", "../", "../../x.ipynb", "sub/../../x"):
        error = refused(v.inside_root, str(root), relative, "path")
        assert error.status_code == 400 and error.message == "'path' must not contain '..'"
    for relative in ("/etc/passwd", "~/x"):
        assert "relative" in refused(v.inside_root, str(root), relative, "path").message
    escape = refused(v.inside_root, str(root), "escape/Containerfile", "path")
    assert escape.status_code == 403 and "outside" in escape.message
