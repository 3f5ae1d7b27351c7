"""The %podman_hpc magics in a real ipykernel on the real stack.

Cells run with ``allow_stdin=False`` (what nbclient and nbval send: the text
form) or ``allow_stdin=True`` (what JupyterLab sends: widgets, checked
through the widget models' comm traffic, as a front end would receive it).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.helpers.magics_kernel import MPI_ENV, WIDGET_MIME, short_error, start_session
from tests.integration.engine.slow_registry import SlowRegistry

ALLREDUCE = (
    "import os\n"
    "from mpi4py import MPI\n"
    "comm = MPI.COMM_WORLD\n"
    "total = comm.allreduce(comm.rank + 1, op=MPI.SUM)\n"
    "print(f\"rank {comm.rank} of {comm.size} on {os.environ['SLURMD_NODENAME']}: sum {total}\")\n"
)
JOB_TIMEOUT = 300


def local_exists(hpc, ref) -> bool:
    return hpc("image", "exists", ref, check=False).returncode == 0


def html_values(kernel) -> list[str]:
    return [
        str(state.get("value", ""))
        for state in kernel.widget_states().values()
        if state.get("_model_name") == "HTMLModel"
    ]


def models(kernel, name: str) -> dict[str, dict]:
    return {cid: state for cid, state in kernel.widget_states().items() if state.get("_model_name") == name}


# --- build ---------------------------------------------------------------------------------


def test_build_from_a_cell_shows_its_steps_then_squashes_and_lists_it(kernel, hpc, stack):
    tag = "localhost/tests/magic-build:1"
    cell = kernel.execute(
        f"%%podman_hpc build -t {tag} --build-arg GREETING=hello --squash\n"
        f"FROM {stack.tiny_image}\n"
        "ARG GREETING=none\n"
        'RUN echo "greeting=$GREETING" > /greeting\n'
    )
    assert cell.ok, cell.show()
    lines = cell.stdout.splitlines()
    assert lines[:3] == [
        f"STEP 1/3: FROM {stack.tiny_image}",
        "STEP 2/3: ARG GREETING=none",
        'STEP 3/3: RUN echo "greeting=$GREETING" > /greeting',
    ], cell.show()
    assert lines[3] == f"Squashing {tag}"  # the engine's build_and_squash
    assert re.fullmatch(
        rf"Squashed {re.escape(tag)} \([0-9a-f]{{12}}\) into {re.escape(str(hpc.squash_dir))}", lines[4]
    ), cell.show()
    assert len(lines) == 5 and cell.stderr == ""
    assert not cell.data(WIDGET_MIME) and "IntProgress(" not in cell.text() and "VBox(" not in cell.text()

    cell = kernel.execute(
        "images = %podman_hpc images magic-build\n[(i.names, i.squashed, i.local, i.stores) for i in images]"
    )
    assert cell.ok, cell.show()
    assert cell.result["text/plain"] == f"[(['{tag}'], True, True, 'local + squashed')]", cell.show()

    # The build log is there for whoever wants it: --log prints it in the text form.
    cell = kernel.execute(
        f"%%podman_hpc build -t localhost/tests/magic-log:1 --log\nFROM {stack.tiny_image}\nRUN echo logged-line\n"
    )
    assert cell.ok and "    logged-line" in cell.stdout.splitlines(), cell.show()
    cell = kernel.execute(f"%podman_hpc run {tag} cat /greeting")
    assert cell.ok and cell.stdout == "greeting=hello\n", cell.show()


def test_build_in_a_widget_front_end_shows_the_step_and_the_log(kernel, stack):
    tag = "localhost/tests/magic-widgets:1"
    cell = kernel.execute(
        f"%%podman_hpc build -t {tag}\nFROM {stack.tiny_image}\nRUN echo line-one && echo line-two\n", allow_stdin=True
    )
    assert cell.ok, cell.show()
    assert len(cell.data(WIDGET_MIME)) == 1 and cell.stdout == "", cell.show()
    states = kernel.widget_states()
    texts = html_values(kernel)
    assert any("STEP 2/2: RUN echo line-one &amp;&amp; echo line-two" in t for t in texts), texts
    assert any("line-one\nline-two" in t for t in texts), texts  # the log, in the accordion
    assert any(t.startswith("<span style='color:green'>&#10004; Built " + tag) for t in texts), texts
    accordion = next(s for s in states.values() if s["_model_name"] == "AccordionModel")
    assert accordion["titles"] == ["Build log"] and accordion["selected_index"] is None  # collapsed
    bars = [s for s in states.values() if s["_model_name"] == "IntProgressModel"]
    assert bars and bars[0]["max"] == 2 and bars[0]["value"] == 2 and bars[0]["bar_style"] == "success"


@pytest.mark.parametrize("widgets", [False, True], ids=["text", "widgets"])
def test_a_failing_run_step_shows_the_step_and_its_last_lines_and_tags_nothing(kernel, hpc, stack, widgets):
    tag = f"localhost/tests/magic-fail-{int(widgets)}:1"
    cell = kernel.execute(
        f"%%podman_hpc build -t {tag}\nFROM {stack.tiny_image}\nRUN echo fine\n"
        "RUN echo about to fail && echo on stderr >&2 && exit 3\nRUN echo never\n",
        allow_stdin=widgets,
    )
    text = short_error(cell)
    step = "STEP 3/4: RUN echo about to fail && echo on stderr >&2 && exit 3"
    assert (
        text.splitlines()[0] == f"podman-hpc: error: build of {tag} failed at {step}: "
        "while running runtime: exit status 3"
    ), cell.show()
    if widgets:
        failed = [t for t in html_values(kernel) if "&#10008;" in t]
        assert failed and "about to fail" in failed[-1] and "on stderr" in failed[-1], html_values(kernel)
    else:  # (the order of the step's stdout and stderr lines is podman's)
        lines = cell.stdout.splitlines()
        assert lines[-3] == "Last lines of output:", cell.show()
        assert sorted(lines[-2:]) == ["    about to fail", "    on stderr"], cell.show()
        assert "STEP 4/4" not in cell.stdout
    assert not local_exists(hpc, tag)


# --- pull, squash, rmsqi, images ---------------------------------------------------------


def test_pull_renders_byte_progress_per_layer_then_squash_progress(kernel, hpc, stack):
    with SlowRegistry(stack.registry, 256 << 10) as proxy:
        conf = proxy.registries_conf(hpc.work)
        ref = stack.tiny_image.replace(stack.registry, proxy.address, 1)
        cell = kernel.execute(f"import os; os.environ['CONTAINERS_REGISTRIES_CONF'] = {str(conf)!r}")
        assert cell.ok
        try:
            cell = kernel.execute(f"%podman_hpc pull {ref}", allow_stdin=True)
        finally:
            kernel.execute("del os.environ['CONTAINERS_REGISTRIES_CONF']")
    assert cell.ok, cell.show()
    # The engine's events, as the renderer received them (byte counts of the 1 MB layer).
    events = kernel.execute(
        "r = get_ipython().magics_manager.registry['PodmanHPCMagics'].last_renderer\n"
        "[(e.stage, e.message, e.current, e.total) for e in r.events]"
    )
    seen = eval(events.result["text/plain"])  # noqa: S307 - our own repr of tuples
    downloading = [e for e in seen if e[1].startswith("Downloading")]
    assert downloading and all(0 <= e[2] <= e[3] for e in downloading), seen
    # The layer's bar, as the front end saw it move.
    bars = models(kernel, "IntProgressModel")
    layer = downloading[0][1].split()[-1]
    bar_id = next(cid for cid, s in bars.items() if s.get("description") == layer)
    values = [u["value"] for u in kernel.updates(bar_id) if "value" in u]
    assert any(0 < v < downloading[0][3] for v in values), values  # part-way: byte progress
    assert bars[bar_id]["value"] == bars[bar_id]["max"] == downloading[0][3]
    labels = [
        str(e["content"]["data"].get("state", {}).get("value", "")) for e in kernel.comms if e["msg_type"] == "comm_msg"
    ]
    assert any(re.fullmatch(r"\d+\.\d (kB|MB) / 1\.1 MB", label) for label in labels), labels
    squash = next(iter(models(kernel, "FloatProgressModel").values()))
    assert squash["value"] == 1.0 and squash["bar_style"] == "success"
    assert any(t.startswith(f"<span style='color:green'>&#10004; Squashed {ref}") for t in html_values(kernel))
    assert local_exists(hpc, ref)


def test_pull_squash_migrate_and_rmsqi_in_text(kernel, hpc, stack):
    tiny = stack.tiny_image
    cell = kernel.execute(f"%podman_hpc pull {tiny} --no-squash")
    assert cell.ok, cell.show()
    lines = cell.stdout.splitlines()
    assert lines[0] == f"Pulling {tiny}" and lines[-1].startswith(f"Pulled {tiny} (")
    assert any(re.fullmatch(r"  layer [0-9a-f]{12}: downloaded.*", line) for line in lines), cell.show()
    assert not any("Squash" in line for line in lines)

    cell = kernel.execute(f"%podman_hpc squash {tiny}")
    assert cell.ok and cell.stdout.splitlines()[-1].startswith(f"Squashed {tiny} ("), cell.show()
    cell = kernel.execute(f"%podman_hpc migrate {tiny}")
    assert cell.ok and "is already in the squashed store" in cell.stdout, cell.show()
    assert "yes" in hpc("images").stdout

    cell = kernel.execute(f"%podman_hpc rmsqi {tiny}")
    assert cell.ok and cell.stdout.startswith(f"Removed {tiny} ("), cell.show()
    assert short_error(kernel.execute(f"%podman_hpc rmsqi {tiny}"))


def test_images_is_a_table_and_a_list_of_records(base_kernel, stack):
    cell = base_kernel.execute("images = %podman_hpc images\nimages")
    assert cell.ok, cell.show()
    table = cell.result["text/html"]
    assert table.startswith("<table>") and f"<td style='text-align:left'>{stack.base_image}</td>" in table
    for column in ("REPOSITORY:TAG", "IMAGE ID", "CREATED", "SIZE", "SQUASHED", "STORE"):
        assert f">{column}</th>" in table
    plain = cell.result["text/plain"].splitlines()
    assert plain[0].split() == ["REPOSITORY:TAG", "IMAGE", "ID", "CREATED", "SIZE", "SQUASHED", "STORE"]
    row = next(line for line in plain if line.startswith(stack.base_image))
    assert row.split()[-2:] == ["yes", "squashed"]
    cell = base_kernel.execute(
        f"base = images.named({stack.base_image!r})\n"
        "import json; json.dumps([base.squashed, base.local, base.size > 0, len(base.id), "
        "sorted(images.records()[0])])"
    )
    assert cell.ok, cell.show()
    assert json.loads(eval(cell.result["text/plain"])) == [  # noqa: S307
        True,
        False,
        True,
        64,
        [
            "additional",
            "created",
            "id",
            "local",
            "names",
            "shadowed",
            "short_id",
            "size",
            "squashed",
            "store",
            "stores",
        ],
    ]
    cell = base_kernel.execute("%podman_hpc images no-such-name-here")
    assert cell.ok and cell.result["text/plain"] == "no images", cell.show()


# --- run -------------------------------------------------------------------------------------


def test_run_streams_the_output_into_the_cell(base_kernel, squashed_base, stack):
    cell = base_kernel.execute(
        f"%podman_hpc run {stack.base_image} sh -c 'echo first; sleep 2; echo second; echo oops >&2'"
    )
    assert cell.ok, cell.show()
    assert cell.stdout == "first\nsecond\n" and cell.stderr == "oops\n"
    times = {o["content"]["text"].strip(): o["time"] for o in cell.outputs if o["msg_type"] == "stream"}
    assert times["second"] - times["first"] > 1.5, times  # streamed, not at the end
    # Module flags and podman options, parsed as the CLI parses them.
    cell = base_kernel.execute(
        f"%podman_hpc run --scratch -e SCRATCH {stack.base_image} "
        "python3 -c 'import os; print(os.path.isdir(os.environ[\"SCRATCH\"]))'"
    )
    assert cell.ok and cell.stdout == "True\n", cell.show()
    assert squashed_base("ps", "--all", "--format", "{{.Names}}").stdout.strip() == ""  # --rm
    text = short_error(base_kernel.execute(f"%podman_hpc run {stack.base_image} sh -c 'exit 3'"))
    assert text == "podman-hpc: error: the command exited with code 3"
    text = short_error(base_kernel.execute("%podman_hpc run localhost/no-such-image:1 true"))
    assert "no-such-image" in text and "(exit code 125)" in text, text


# --- jobs -----------------------------------------------------------------------------------


@pytest.fixture
def program(squashed_base):
    path = squashed_base.work / f"allreduce-{uuid.uuid4().hex[:6]}.py"
    path.write_text(ALLREDUCE)
    yield path
    path.unlink(missing_ok=True)


def test_submit_preview_shows_the_batch_script_and_submits_nothing(base_kernel, squashed_base, stack, program):
    cell = base_kernel.execute(
        f"%podman_hpc submit --nodes 4 --tasks-per-node 2 --time 10 --partition {stack.partition} "
        f"--module openmpi-pmix {MPI_ENV} --preview {stack.base_image} --script {program}"
    )
    assert cell.ok, cell.show()
    script = cell.stdout
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=allreduce-"), script
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --time=10",
        f"#SBATCH --partition={stack.partition}",
        "export OMPI_MCA_btl=self,tcp",
        "export OMPI_MCA_btl_tcp_if_include=lo",
        "export OMPI_MCA_oob_tcp_if_include=lo",
    ):
        assert line in script.splitlines(), script
    assert "srun --mpi=pmix" in script and "podman-hpc shared-run --openmpi-pmix" in script
    jobs = squashed_base.work / "scratch" / "podman-hpc" / "jobs"
    assert not jobs.exists() or [p for p in jobs.iterdir() if not p.name.startswith(".")] == []


def test_a_4_node_job_runs_to_completed_with_a_live_status_widget(base_kernel, stack, program):
    cell = base_kernel.execute(
        f"job = %podman_hpc submit --nodes 4 --tasks-per-node 2 --time 10 --module openmpi-pmix {MPI_ENV} "
        f"{stack.base_image} --script {program}",
        allow_stdin=True,
    )
    assert cell.ok, cell.show()
    match = re.fullmatch(r"Submitted job (\d+) \(4 node\(s\) x 2 task\(s\), podman-exec\) in (\S+)\n", cell.stdout)
    assert match, cell.show()
    job_id = match.group(1)

    shown = base_kernel.execute("job", allow_stdin=True)
    assert shown.ok and len(shown.data(WIDGET_MIME)) == 1, shown.show()
    assert shown.ended - shown.started < 5  # displaying does not wait for the job
    assert shown.result["text/plain"].startswith(f"job {job_id} ")
    comm_id = shown.data(WIDGET_MIME)[0]["model_id"]

    # The kernel stays free while the widget follows the job.
    quick = base_kernel.execute("1 + 1")
    assert quick.ok and quick.result["text/plain"] == "2" and quick.ended - quick.started < 2

    def finished(session) -> bool:
        state = session.widget_states().get(comm_id, {})
        return "COMPLETED" in state.get("value", "") or "FAILED" in state.get("value", "")

    base_kernel.listen(JOB_TIMEOUT, until=finished)
    updates = base_kernel.updates(comm_id)
    final = base_kernel.widget_states()[comm_id]["value"]
    assert (
        "COMPLETED" in final
        and "<th style='text-align:left;padding-right:1em'>Exit code</th><td style='text-align:left'>0</td>" in final
    ), final
    assert "n[1-4]" in final
    after = [u for u in updates if u["_time"] > shown.ended]
    assert len(after) >= 2, updates  # updated after the cell returned

    cell = base_kernel.execute("status = job.wait(timeout=300)\n(status.state, status.exit_code, len(job.logs()))")
    assert cell.ok and cell.result["text/plain"] == "('COMPLETED', 0, 8)", cell.show()
    cell = base_kernel.execute("job.logs()")
    logs = eval(cell.result["text/plain"])  # noqa: S307 - a dict of str
    nodes = ["n1", "n1", "n2", "n2", "n3", "n3", "n4", "n4"]
    assert logs == {rank: f"rank {rank} of 8 on {nodes[rank]}: sum 36\n" for rank in range(8)}
    cell = base_kernel.execute(f"%podman_hpc logs {job_id}")
    assert cell.ok and cell.stdout.splitlines() == [f"{r}: rank {r} of 8 on {nodes[r]}: sum 36" for r in range(8)]
    cell = base_kernel.execute("%podman_hpc jobs")
    assert cell.ok and re.search(
        rf"^{job_id}\s+allreduce-\w+\s+COMPLETED\s+n\[1-4\]", cell.result["text/plain"], re.M
    ), cell.show()
    assert f">{job_id}</td>" in cell.result["text/html"]


def test_a_notebook_job_names_its_output_notebook_in_submit_logs_and_jobs(base_kernel, stack, tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("word = 'default'", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import os\nif os.environ['SLURM_PROCID'] == '1':\n    raise KeyError(word)\nprint(word)"
        ),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "Words.ipynb"
    nbformat.write(notebook, str(path))
    cell = base_kernel.execute(
        f"job = %podman_hpc submit --nodes 2 --time 5 {stack.base_image} --notebook {path} --param \"word='given'\""
    )
    assert cell.ok, cell.show()
    job_id = re.search(r"Submitted job (\d+)", cell.stdout).group(1)
    assert re.search(r"Output notebook \(rank 0 writes it as cells run\): /\S+/Words\.out\.ipynb\n", cell.stdout)
    cell = base_kernel.execute(f"job.wait(timeout={JOB_TIMEOUT}).state, job.output_notebook.name")
    assert cell.ok and cell.result["text/plain"] == "('FAILED', 'Words.out.ipynb')", cell.show()
    cell = base_kernel.execute(f"%podman_hpc logs {job_id}")
    assert cell.ok, cell.show()
    assert re.match(
        r"Output notebook: /\S+/Words\.out\.ipynb \(cell 3 failed on rank 1: KeyError: 'given'\)\n"
        r"0: given\n",
        cell.stdout,
    ), cell.show()
    cell = base_kernel.execute("%podman_hpc jobs")
    assert cell.ok, cell.show()
    row = next(line for line in cell.result["text/plain"].splitlines() if line.startswith(job_id))
    assert row.endswith("Words.out.ipynb (cell 3 failed on rank 1)"), row
    text = short_error(
        base_kernel.execute(f"%podman_hpc submit {stack.base_image} --notebook {path} --param word=given")
    )
    assert "error: parameters: word=given is not a Python literal" in text, text


def test_cancel_a_job(base_kernel, stack):
    cell = base_kernel.execute(f"job = %podman_hpc submit --nodes 1 {stack.base_image} sleep 300")
    assert cell.ok, cell.show()
    job_id = re.search(r"Submitted job (\d+)", cell.stdout).group(1)
    cell = base_kernel.execute(f"%podman_hpc cancel {job_id}")
    assert cell.ok and cell.stdout == f"Cancelled job {job_id}\n", cell.show()
    cell = base_kernel.execute("job.wait(timeout=120).state")
    assert cell.ok and cell.result["text/plain"] == "'CANCELLED'", cell.show()


# --- kernels, info --------------------------------------------------------------------------


def test_kernel_install_list_remove_round_trip(kernel, stack, tmp_path):
    cell = kernel.execute(
        f"%podman_hpc kernel install {stack.base_image} --name magic-test --display-name 'Magic test' --module home"
    )
    assert cell.ok, cell.show()
    path = tmp_path / "kernel" / "data" / "kernels" / "magic-test"
    assert cell.stdout == f"Installed kernel magic-test (Magic test) in {path}\n"
    spec = json.loads((path / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"] == {"image": stack.base_image, "modules": ["home"]}

    cell = kernel.execute("kernels = %podman_hpc kernel list\nkernels")
    assert cell.ok and "magic-test" in cell.result["text/plain"] and ">Magic test</td>" in cell.result["text/html"]
    cell = kernel.execute("[(k.name, k.image, k.modules) for k in kernels]")
    assert cell.result["text/plain"] == f"[('magic-test', '{stack.base_image}', ['home'])]"

    cell = kernel.execute("%podman_hpc kernel remove magic-test")
    assert cell.ok and cell.stdout == f"Removed kernel magic-test from {path}\n" and not path.exists()
    cell = kernel.execute("%podman_hpc kernel list")
    assert cell.ok and cell.result["text/plain"] == "no podman-hpc kernels"
    assert "no podman-hpc kernel named magic-test" in short_error(
        kernel.execute("%podman_hpc kernel remove magic-test")
    )


def test_info_shows_the_effective_configuration(base_kernel, squashed_base):
    cell = base_kernel.execute("%podman_hpc info")
    assert cell.ok, cell.show()
    assert f"squash_dir (env: SQUASH_DIR): {squashed_base.squash_dir}" in cell.stdout.splitlines()
    assert " - openmpi-pmix: --openmpi-pmix  Enable Open MPI with PMIx (srun --mpi=pmix)" in cell.stdout


# --- bad input ------------------------------------------------------------------------------


# Parser and job-spec refusals are unit tests (tests/unit/magics/test_display.py, test_parser.py,
# tests/unit/slurm/test_spec.py); here: one usage error in a real kernel, and what needs the stack.
BAD = {
    "unknown image": (
        "%podman_hpc squash localhost/no-such-image:1",
        "image localhost/no-such-image:1 not found in the local storage: pull or build it first",
    ),
    "unknown image to pull": ("%podman_hpc pull {registry}/jph/no-such-image:1", "cannot pull"),
    "unknown image to submit": (
        "%podman_hpc submit --nodes 1 localhost/no-such-image:1 true",
        "is not in the squashed store",
    ),
    "bad option": ("%podman_hpc images --bogus", "unrecognized arguments: --bogus\n\nusage: %podman_hpc images"),
    "unknown module": ("%podman_hpc submit --module nope {tiny} true", "unknown module 'nope'"),
    "bad reference": ("%%podman_hpc build -t Not/Valid\nFROM scratch\n", "invalid image reference"),
    "run without image": ("%podman_hpc run --rm", "run needs an IMAGE"),
    "unknown job": ("%podman_hpc logs 99999999", "no job 99999999"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gives_a_message_not_a_traceback(base_kernel, stack, case):
    code, expected = BAD[case]
    code = code.format(tiny=stack.tiny_image, registry=stack.registry)
    text = short_error(base_kernel.execute(code))
    assert expected in text, text


def test_debug_shows_the_traceback(base_kernel):
    kernel = base_kernel
    cell = kernel.execute("%podman_hpc --debug squash localhost/no-such-image:1")
    assert not cell.ok and cell.error["ename"] == "ImageNotFound"
    assert "Traceback" in cell.error_text and "migrate" in cell.error_text
    cell = kernel.execute("%podman_hpc help submit")
    assert cell.ok and cell.stdout.startswith("usage: %podman_hpc submit --nodes N"), cell.show()


# --- headless or not --------------------------------------------------------------------------


def test_headless_requests_get_text_and_interactive_ones_widgets(squashed_tiny, stack, tmp_path):
    command = f"%podman_hpc squash {stack.tiny_image}"
    cases = [
        ({}, False, "text"),
        ({}, True, "widgets"),
        ({"PODMAN_HPC_WIDGETS": "0"}, True, "text"),
        ({"PODMAN_HPC_WIDGETS": "1"}, False, "widgets"),
    ]
    for index, (extra, allow_stdin, expected) in enumerate(cases):
        session = start_session(squashed_tiny, tmp_path / f"k{index}", **extra)
        try:
            cell = session.execute(command, allow_stdin=allow_stdin)
        finally:
            session.close()
        assert cell.ok, cell.show()
        if expected == "text":
            assert not cell.data(WIDGET_MIME) and "Box(" not in cell.text(), (extra, allow_stdin, cell.show())
            assert cell.stdout.splitlines()[0] == f"Squashing {stack.tiny_image}"
            assert re.fullmatch(
                rf"{re.escape(stack.tiny_image)} \([0-9a-f]{{12}}\) is already in the squashed "
                rf"store {re.escape(str(squashed_tiny.squash_dir))}",
                cell.stdout.splitlines()[1],
            )
        else:
            assert len(cell.data(WIDGET_MIME)) == 1 and cell.stdout == "", (extra, allow_stdin, cell.show())
