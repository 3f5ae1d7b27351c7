"""Code in an image against the job directory it runs from (issue 38): the ranks see the job
directory read-only and write only its out/, the host's finish runs the installed runner and
takes nothing from out/ but data, and what the ranks (or their logs) left is read bounded,
never through a link and never waiting on a FIFO.

The attacker is a notebook's cell, standing in for code in the image: it runs in every rank's
container. The host's side is this test's user on the batch host and the Jupyter server."""

import hashlib
import json
import os
import resource
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from jupyter_podman_hpc.slurm import Job
from tests.helpers.commands import run
from tests.integration.slurm.notebooks import TIMEOUT, executed, notebook_file, notebook_spec

INPUTS = ("Attack.ipynb", "nbrunner.py", "nbcells.py", "nbrecorder.py", "nbrun/plan.json", "job.sh")

# Each rank tries to make the host run its code or write the user's files, and prints what came of it.
ATTACK = """
import json, os, sys, time
job_dir = os.path.dirname(os.path.abspath(sys.argv[0]))  # the runner sets argv[0] to the notebook
rank = int(os.environ["SLURM_PROCID"])
payload = "\\ntry:\\n    open({marker!r}, 'a').write('ran on the host\\\\n')\\nexcept OSError:\\n    pass\\n"

def append(name):
    with open(os.path.join(job_dir, name), "a") as source:
        source.write(payload)

def plant_json():
    with open(os.path.join(job_dir, "json.py"), "w") as module:
        module.write(payload)

def redirect_output():
    path = os.path.join(job_dir, "nbrun", "plan.json")
    with open(path) as source:
        plan = json.load(source)
    plan["output"] = {home_file!r}
    with open(path, "w") as target:
        json.dump(plan, target)

def relink_state():
    out = os.path.join(job_dir, "out")
    # once every rank's runner holds out/nbrun open (it got here): a rank starting later would find the link
    deadline = time.monotonic() + 120
    while len([n for n in os.listdir(out) if n.startswith("here-")]) < int(os.environ["SLURM_NTASKS"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.rename(os.path.join(out, "nbrun"), os.path.join(out, "nbrun.moved"))
    os.symlink({home_dir!r}, os.path.join(out, "nbrun"))

try:
    open(os.path.join(job_dir, "out", "here-%d" % rank), "w").close()
except OSError:
    pass  # an older layout: no out/
attacks = [("nbrunner.py", lambda: append("nbrunner.py")), ("nbcells.py", lambda: append("nbcells.py")),
           ("json.py", plant_json), ("plan.json", redirect_output)]
if rank == 0:  # rank 0's runner holds out/nbrun open already: the run itself goes on
    attacks.append(("out/nbrun", relink_state))
for what, attack in attacks:
    try:
        attack()
        print(rank, what, "written")
    except OSError as err:
        print(rank, what, "refused:", err.strerror)
"""


def digests(directory: Path, names) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in names}


@pytest.fixture
def home_target():
    """A directory in the user's $HOME (which no rank mounts) holding a file like ~/.bashrc."""
    directory = Path.home() / f".jph-attack-{uuid.uuid4().hex[:8]}"
    (directory / "state").mkdir(parents=True)
    (directory / "bashrc").write_text("# the user's own\n")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_image_code_cannot_make_the_host_run_or_write_anything_from_the_job_directory(
    squashed_base, stack, root, home_target
):
    marker = root / "ran-on-the-host"
    attack = ATTACK.format(
        marker=str(marker), home_file=str(home_target / "bashrc"), home_dir=str(home_target / "state")
    )
    path = notebook_file(root / "Attack.ipynb", ["print('before')", attack, "print('after', 6 * 7)"])
    job = Job.submit(notebook_spec(stack, squashed_base, path), root / "jobs")
    before = digests(job.directory, INPUTS)
    status = job.wait(timeout=TIMEOUT, poll_interval=0.5)

    # nothing ran on the host, nothing outside out/ changed, the user's $HOME is as it was
    assert not marker.exists(), marker.read_text()
    assert digests(job.directory, INPUTS) == before
    assert (status.state, status.exit_code) == ("COMPLETED", 0), (status, job.logs("err"), job.batch_log())
    host_written = {"job.json", f"slurm-{job.id}.out", "rank-0.out", "rank-0.err", "rank-1.out", "rank-1.err"}
    assert {p.name for p in job.directory.iterdir()} == {*INPUTS, *host_written, "nbrun", "out"} - {"nbrun/plan.json"}
    assert os.listdir(job.directory / "nbrun") == ["plan.json"]
    assert (home_target / "bashrc").read_text() == "# the user's own\n"
    assert os.listdir(home_target / "state") == []

    # every rank was refused the job directory; rank 0 could only play in out/
    for rank in (0, 1):
        log = job.logs()[rank]
        for what in ("nbrunner.py", "nbcells.py", "json.py", "plan.json"):
            assert f"{rank} {what} refused: Read-only file system\n" in log, log
    assert "0 out/nbrun written\n" in job.logs()[0]

    # the normal flow: the output notebook in out/ with every cell's outputs, the finish's progress
    info = job.output_notebook()
    assert info["path"] == str(job.directory / "out" / "Attack.out.ipynb")
    cells = executed(job).cells
    assert cells[0].outputs[0].text == "before\n" and cells[2].outputs[0].text == "after 42\n"
    assert "0 plan.json refused: Read-only file system\n" in cells[1].outputs[0].text
    assert executed(job).metadata.podman_hpc.state == "completed"
    assert (job.directory / "out" / "nbrun").is_dir() and not (job.directory / "out" / "nbrun").is_symlink()
    assert info["progress"]["state"] == "completed"


# Run in a process of its own: a reader that follows the link to /dev/zero runs out of the memory
# it is given, not the machine's, and one that waits on the FIFO is killed at the timeout.
READER = """
import json, sys, time
import nbformat  # loaded already in a Jupyter server: its import is no part of a read
from jupyter_podman_hpc.slurm import Job
from jupyter_podman_hpc.slurm.notebook import read_output
root, job_id = sys.argv[1], sys.argv[2]
seen = {}
def timed(name, call):
    started = time.monotonic()
    try:
        value = call()
    except Exception as err:
        value = "raised %s: %s" % (type(err).__name__, err)
    seen[name] = [time.monotonic() - started, value]
timed("list", lambda: [job.as_dict()["output"] for job in Job.list(root)])
job = Job.find(job_id, root)
for name, call in (("logs", job.logs), ("errors", lambda: job.logs("err")), ("labelled", job.labelled_output),
                   ("batch", job.batch_log), ("output_info", job.output_notebook),
                   ("read_output", lambda: read_output(job.output_notebook()))):
    timed(name, call)
print(json.dumps(seen))
"""


def read_back(root: Path, job: Job) -> dict:
    """What a fresh process (the Jupyter server's view) reads of the job: {call: [seconds, value]}."""

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = run([sys.executable, "-c", READER, str(root / "jobs"), job.id], timeout=60, preexec_fn=limit_memory)
    return json.loads(result.stdout)


def as_an_older_version_left_it(directory: Path, output: str) -> None:
    """The job directory as versions before out/ wrote it: the output notebook and the progress at its
    top, no "out" in the record's run."""
    record = json.loads((directory / "job.json").read_text())
    if record["run"].pop("out", None) is None:
        return  # an older version wrote it
    os.replace(directory / "out" / output, directory / output)
    os.replace(directory / "out" / "nbrun" / "progress.json", directory / "nbrun" / "progress.json")
    (directory / "job.json").write_text(json.dumps(record))


def test_logs_and_outputs_planted_as_links_or_fifos_are_one_line_each_and_answer_at_once(squashed_base, stack, root):
    path = notebook_file(root / "Plain.ipynb", ["import os\nprint('rank', os.environ['SLURM_PROCID'])"])
    job = Job.submit(notebook_spec(stack, squashed_base, path, nodes=1, tasks_per_node=2), root / "jobs")
    status = job.wait(timeout=TIMEOUT, poll_interval=0.5)
    assert status.state == "COMPLETED", (status, job.logs("err"), job.batch_log())
    directory = job.directory

    as_an_older_version_left_it(directory, "Plain.out.ipynb")
    seen = read_back(root, job)
    assert seen["logs"][1] == {"0": "rank 0\n", "1": "rank 1\n"}
    assert seen["output_info"][1]["path"] == str(directory / "Plain.out.ipynb")
    assert seen["output_info"][1]["progress"]["state"] == "completed"
    assert seen["read_output"][1]["cells"][0]["outputs"][0]["text"] == "rank 0\n"

    # what its ranks could have left there, written as they could
    for name in ("rank-0.out", "Plain.out.ipynb", f"slurm-{job.id}.out"):
        (directory / name).unlink()
        (directory / name).symlink_to("/dev/zero")
    for name in ("rank-1.out", "nbrun/progress.json"):
        (directory / name).unlink()
        os.mkfifo(directory / name)
    seen = read_back(root, job)
    slow = {name: seconds for name, (seconds, _) in seen.items() if seconds >= 2}
    assert slow == {}
    assert seen["logs"][1] == {
        "0": "rank-0.out is a symbolic link: not read\n",
        "1": "rank-1.out is not a regular file: not read\n",
    }
    assert seen["labelled"][1] == (
        "0: rank-0.out is a symbolic link: not read\n1: rank-1.out is not a regular file: not read\n"
    )
    assert seen["batch"][1] == f"slurm-{job.id}.out is a symbolic link: not read\n"
    output = seen["output_info"][1]
    assert (output["exists"], output["progress"]) == (False, None)
    assert seen["list"][1] == [output]
    assert seen["read_output"][1] == "raised UntrustedFile: Plain.out.ipynb is a symbolic link: not read"
