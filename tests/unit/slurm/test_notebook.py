"""A notebook put into a job directory: its copy (parameters injected), the runner, the plan;
what happens to IPython magics; reading back the output notebook's state."""

import json
import shutil

import nbformat
import pytest

from jupyter_podman_hpc.engine.base.files import UntrustedFile
from jupyter_podman_hpc.slurm import notebook as notebooks
from jupyter_podman_hpc.slurm.notebook import OutputTooLarge, describe_progress, output_info, prepare, read_output
from jupyter_podman_hpc.slurm.spec import JobSpecError, check_parameters


def write_notebook(path, cells, language="python", tags=None):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A title")] + [nbformat.v4.new_code_cell(c) for c in cells]
    for index, tag in (tags or {}).items():
        notebook.cells[index].metadata["tags"] = [tag]
    notebook.metadata["kernelspec"] = {"name": "k", "display_name": "k", "language": language}
    nbformat.write(notebook, str(path))
    return path


def plan_of(directory):
    return json.loads((directory / "nbrun" / "plan.json").read_text())


def test_a_plain_notebook_runs_without_ipython(tmp_path):
    path = write_notebook(tmp_path / "plain.ipynb", ["x = 6 * 7", "print('answer', x)"])
    out = tmp_path / "job"
    out.mkdir()
    prepared = prepare(path, out)
    assert (prepared.notebook, prepared.output, prepared.ipython) == ("plain.ipynb", "plain.out.ipynb", "never")
    assert prepared.magics == () and prepared.warnings == ()
    assert {p.name for p in out.iterdir()} == {
        "plain.ipynb",
        "nbrunner.py",
        "nbcells.py",
        "nbrecorder.py",
        "nbrun",
        "out",
    }
    assert plan_of(out) == {
        "version": 2,
        "notebook": "plain.ipynb",
        "out": "out",
        "output": "plain.out.ipynb",
        "ipython": "never",
        "code": {},
    }
    assert [p.name for p in (out / "out").iterdir()] == ["nbrun"]  # where the ranks write
    assert all((out / d).stat().st_mode & 0o777 == 0o700 for d in ("nbrun", "out", "out/nbrun"))
    nbformat.validate(nbformat.read(str(out / "plain.ipynb"), as_version=4))


def test_magics_require_ipython_and_displays_prefer_it(tmp_path):
    path = write_notebook(tmp_path / "magic.ipynb", ["%time y = 2", "!echo from-the-shell", "print('y', y)"])
    prepared = prepare(path, tmp_path)
    assert prepared.ipython == "require"
    assert len(prepared.magics) == 2 and all("get_ipython()" in m for m in prepared.magics)
    shown = write_notebook(tmp_path / "shown.ipynb", ["from IPython.display import display", "display(1)"])
    (tmp_path / "other").mkdir()
    assert prepare(shown, tmp_path / "other").ipython == "prefer"


def test_magics_can_be_commented_out_for_images_without_ipython(tmp_path):
    path = write_notebook(
        tmp_path / "magic.ipynb", ["%time t = 1\nz = 3", "for i in range(2):\n    !echo {i}", "print('z', z)"]
    )
    prepared = prepare(path, tmp_path, magics="comment")
    assert prepared.ipython == "never" and len(prepared.magics) == 2
    assert prepared.warnings and "commented out" in prepared.warnings[0]
    code = plan_of(tmp_path)["code"]
    assert sorted(code) == ["1", "2"]  # the cells' indices in the notebook (0 is markdown)
    assert code["1"].startswith("pass  # magic (not run): get_ipython()") and "z = 3" in code["1"]
    assert "    pass  # magic (not run): get_ipython().system" in code["2"]
    # the notebook keeps its source: the output notebook shows what the user wrote
    assert nbformat.read(str(tmp_path / "magic.ipynb"), as_version=4).cells[1].source.startswith("%time")


def test_only_python_notebooks_and_real_notebooks(tmp_path):
    with pytest.raises(JobSpecError, match="is a R notebook"):
        prepare(write_notebook(tmp_path / "r.ipynb", ["1"], language="R"), tmp_path)
    (tmp_path / "broken.ipynb").write_text("{not json")
    with pytest.raises(JobSpecError, match=r"cannot be read|is not a valid notebook"):
        prepare(tmp_path / "broken.ipynb", tmp_path)
    with pytest.raises(JobSpecError, match="does not exist"):
        prepare(tmp_path / "missing.ipynb", tmp_path)


def test_parameters_are_injected_after_the_cell_tagged_parameters(tmp_path):
    path = write_notebook(tmp_path / "p.ipynb", ["alpha = 1\nname = 'x'", "print(alpha, name)"], tags={1: "parameters"})
    prepared = prepare(path, tmp_path, parameters={"alpha": "0.5", "name": "'run 2'"})
    assert prepared.warnings == ()
    cells = nbformat.read(str(tmp_path / "p.ipynb"), as_version=4).cells
    assert [c.metadata.get("tags") for c in cells] == [None, ["parameters"], ["injected-parameters"], None]
    assert cells[2].source == "# Parameters (injected at submit)\nalpha = 0.5\nname = 'run 2'"
    # submitted again (papermill's output as input): the injected cell is replaced, not added
    again = tmp_path / "again"
    again.mkdir()
    prepare(tmp_path / "p.ipynb", again, parameters={"alpha": "2"})
    cells = nbformat.read(str(again / "p.ipynb"), as_version=4).cells
    assert [c.source for c in cells if "injected-parameters" in c.metadata.get("tags", [])] == [
        "# Parameters (injected at submit)\nalpha = 2"
    ]


def test_parameters_without_a_tagged_cell_go_first_with_a_warning(tmp_path):
    path = write_notebook(tmp_path / "p.ipynb", ["print(beta)"])
    prepared = prepare(path, tmp_path, parameters={"beta": "[1, 2]"})
    assert prepared.warnings == ("no cell is tagged 'parameters': the parameters are set in a new first cell",)
    assert nbformat.read(str(tmp_path / "p.ipynb"), as_version=4).cells[0].source.endswith("beta = [1, 2]")


@pytest.mark.parametrize(
    "parameters, message",
    [
        (
            {"x": "hello"},
            "parameters: x=hello is not a Python literal (a number, True/False/None, a quoted string "
            "like x='text', a list...)",
        ),
        ({"x": "__import__('os')"}, "is not a Python literal"),
        ({"x": ""}, "is not a Python literal"),
        ({"1x": "1"}, "'1x' is not a Python variable name"),
        ({"class": "1"}, "'class' is not a Python variable name"),
        ({"x": 1}, "must be a string holding a Python literal"),
        ({"x": "[1,\n2]"}, "must be one line"),
    ],
)
def test_bad_parameters_get_one_line(parameters, message):
    with pytest.raises(JobSpecError) as caught:
        check_parameters(parameters)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_good_parameters_are_kept_as_written():
    assert check_parameters({"a": " 1e3 ", "b": "'s'", "c": "{'k': (1, None)}", "d": "True", "e": "-2"}) == {
        "a": "1e3",
        "b": "'s'",
        "c": "{'k': (1, None)}",
        "d": "True",
        "e": "-2",
    }


def test_output_info_of_an_older_job_directory_reads_the_progress_rank_0_wrote_at_its_top(tmp_path):
    run = {"kind": "notebook", "output": "a.out.ipynb"}  # no "out": the ranks wrote the job directory
    assert output_info(tmp_path, {"kind": "command"}) is None
    assert output_info(tmp_path, {"kind": "notebook", "output": "../../etc/passwd"}) is None
    assert output_info(tmp_path, {"kind": "notebook"}) is None  # a notebook job of an older version
    info = output_info(tmp_path, run)
    assert (info["name"], info["exists"], info["progress"]) == ("a.out.ipynb", False, None)
    assert describe_progress(info) == ""
    (tmp_path / "a.out.ipynb").write_text("{}")
    (tmp_path / "nbrun").mkdir()
    (tmp_path / "nbrun" / "progress.json").write_text(
        json.dumps({"state": "running", "cell": 3, "cells": 5, "errors": []})
    )
    info = output_info(tmp_path, run)
    assert info["exists"] and info["path"] == str(tmp_path / "a.out.ipynb")
    assert describe_progress(info) == "rank 0 is in cell 3 of 5"
    (tmp_path / "nbrun" / "progress.json").write_text(
        json.dumps({"state": "failed", "errors": [{"rank": 1, "cell": 3, "ename": "ValueError", "evalue": "bad"}]})
    )
    assert describe_progress(output_info(tmp_path, run)) == "cell 3 failed on rank 1: ValueError: bad"
    (tmp_path / "nbrun" / "progress.json").write_text("{truncated")
    assert output_info(tmp_path, run)["progress"] is None


def test_output_info_reads_the_output_directory_and_follows_no_link_there(tmp_path):
    run = {"kind": "notebook", "out": "out", "output": "a.out.ipynb"}
    assert output_info(tmp_path, {**run, "out": "/home/u"}) is None
    (tmp_path / "out" / "nbrun").mkdir(parents=True)
    (tmp_path / "a.out.ipynb").write_text("{}")  # the top is not where this layout's output is
    info = output_info(tmp_path, run)
    assert (info["path"], info["exists"]) == (str(tmp_path / "out" / "a.out.ipynb"), False)
    (tmp_path / "out" / "nbrun" / "progress.json").write_text(json.dumps({"state": "running", "cell": 2, "cells": 4}))
    (tmp_path / "out" / "a.out.ipynb").write_text("{}")
    info = output_info(tmp_path, run)
    assert info["exists"] and describe_progress(info) == "rank 0 is in cell 2 of 4"
    # the image replaced them with links to the user's files: neither is read
    elsewhere = tmp_path / "home"
    (elsewhere / "nbrun").mkdir(parents=True)
    (elsewhere / "nbrun" / "progress.json").write_text(json.dumps({"state": "planted"}))
    (tmp_path / "out" / "a.out.ipynb").unlink()
    (tmp_path / "out" / "a.out.ipynb").symlink_to(elsewhere / "nbrun" / "progress.json")
    shutil.rmtree(tmp_path / "out" / "nbrun")
    (tmp_path / "out" / "nbrun").symlink_to(elsewhere / "nbrun")
    info = output_info(tmp_path, run)
    assert (info["exists"], info["progress"]) == (False, None)
    with pytest.raises(UntrustedFile, match=r"^a\.out\.ipynb is a symbolic link: not read$"):
        read_output(info)


def test_the_output_notebook_is_read_untrusted_and_bounded(tmp_path, monkeypatch):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "1",
            metadata={"trusted": True},
            outputs=[nbformat.v4.new_output("display_data", {"text/html": "<img src=x onerror='alert(1)'>"})],
        )
    ]
    notebook.metadata["signature"] = "sha256:planted"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.out.ipynb").write_text(json.dumps(notebook))
    info = output_info(tmp_path, {"kind": "notebook", "out": "out", "output": "a.out.ipynb"})
    content = read_output(info)
    assert "trusted" not in content["cells"][0]["metadata"] and "signature" not in content["metadata"]
    assert content["cells"][0]["outputs"][0]["data"]["text/html"].startswith("<img")  # shown, sanitised by the Lab
    monkeypatch.setattr(notebooks, "OUTPUT_LIMIT", 100)
    with pytest.raises(OutputTooLarge, match=r"^the output notebook a.out.ipynb is \d+ B, more than the 100 B "):
        read_output(info)
    for planted in ("[1]", '{"nbformat": 4, "cells": 3}', "{not json"):
        (tmp_path / "out" / "a.out.ipynb").write_text(planted)
        with pytest.raises(ValueError, match=r"^a\.out\.ipynb is not a notebook: "):
            read_output(info)
