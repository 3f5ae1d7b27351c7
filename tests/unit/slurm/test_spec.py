"""JobSpec validation: every field refuses what would break or inject into the batch script."""

import pytest

from jupyter_podman_hpc.engine.site.config import SITE_DATA
from jupyter_podman_hpc.engine.site.modules import ModuleSet
from jupyter_podman_hpc.slurm.spec import JobSpec, JobSpecError, duration_seconds, parse_directive

IMAGE = "registry.example.org:5000/team/image:1.0"
SITE_MODULES = ModuleSet.load(str(SITE_DATA / "modules.d"))


def spec(**changes):
    values = {"image": IMAGE, "command": ["true"]}
    values.update(changes)
    return JobSpec(**values)


def test_a_typical_spec_keeps_its_values_as_tuples_and_strings():
    job = spec(
        command=["python3", "-c", "print(1)"],
        nodes=4,
        tasks_per_node=2,
        time="1:00:00",
        modules=["openmpi-pmix"],
        environment={"A": "1", "N": 3},
        extra_directives=["--mem=4G"],
    )
    assert job.command == ("python3", "-c", "print(1)")
    assert job.modules == ("openmpi-pmix",) and job.extra_directives == ("--mem=4G",)
    assert job.environment == {"A": "1", "N": "3"}
    assert job.ntasks == 8 and job.mode == "podman-exec"
    assert job.default_job_name() == "python3"
    assert JobSpec.from_dict(job.as_dict()) == job


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"command": None}, "exactly one of command, python_script and notebook"),
        ({"python_script": "/a.py"}, "exactly one of command, python_script and notebook"),
        ({"command": []}, "command must be a non-empty list"),
        ({"command": "echo hi"}, "command must be a list of strings"),
        ({"command": ["echo", 3]}, "command must be a list of strings"),
        ({"args": ["x"]}, "args go with python_script or notebook"),
        ({"parameters": {"x": "1"}}, "parameters go with a notebook"),
    ],
)
def test_exactly_one_thing_to_run(changes, field):
    with pytest.raises(JobSpecError, match=field):
        spec(**changes)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("nodes", 0, "nodes must be between 1 and"),
        ("nodes", -2, "nodes must be between 1 and"),
        ("nodes", "4", "nodes must be a whole number"),
        ("nodes", True, "nodes must be a whole number"),
        ("nodes", 2.5, "nodes must be a whole number"),
        ("tasks_per_node", 0, "tasks_per_node must be between 1 and"),
        ("cpus_per_task", 0, "cpus_per_task must be between 1 and"),
        ("gpus_per_node", -1, "gpus_per_node must be between 0 and"),
        ("gpus_per_node", 1000, "gpus_per_node must be between 0 and"),
    ],
)
def test_numbers_must_be_in_range(field, value, message):
    with pytest.raises(JobSpecError, match=message):
        spec(**{field: value})


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("30", 1800),
        ("5:30", 330),
        ("01:00:00", 3600),
        ("100:00:00", 360000),
        ("2-0", 172800),
        ("1-12:30", 131400),
        ("1-00:00:01", 86401),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_time_formats(value, seconds):
    assert duration_seconds(value) == seconds
    assert spec(time=value).time == value


@pytest.mark.parametrize(
    "value", ["1h", "1:2:3:4", "01:60:00", "1-24:00", "1-1:99", "-5", "", " ", "1:00:00; rm -rf /", "0", "00:00:00"]
)
def test_bad_time_limits_are_refused_naming_the_field(value):
    with pytest.raises(JobSpecError, match=r"^time "):
        spec(time=value)


def test_time_may_be_given_as_minutes():
    assert spec(time=90).time == "90"


@pytest.mark.parametrize(
    "directive, message",
    [
        ("--no-such-option=1", "--no-such-option is not an sbatch option this tool accepts"),
        ("--wrap=rm -rf /", "--wrap is not an sbatch option"),
        ("--array=1-10", "--array is not an sbatch option"),
        ("--uid=0", "--uid is not an sbatch option"),
        ("--time=10", "--time is set through time"),
        ("--nodes=3", "--nodes is set through nodes"),
        ("--output=/tmp/x", "--output is set through the job directory"),
        ("--export=NONE", "--export is set through environment"),
        ("-N 4", "is not an sbatch long option"),
        ("mem=4G", "is not an sbatch long option"),
        ("--mem=4 G", "must be non-empty and hold no blanks"),
        ("--comment='x'", "must be non-empty and hold no blanks"),
        ("--comment=a#b", "must be non-empty and hold no blanks"),
        ("--mem=", "must be non-empty"),
    ],
)
def test_directives_come_from_an_allow_list(directive, message):
    with pytest.raises(JobSpecError, match=f"^extra_directives: .*{message}"):
        spec(extra_directives=[directive])


def test_allowed_directives():
    for directive in (
        "--mem=4G",
        "--exclusive",
        "--constraint=gpu&hbm80g",
        "--mail-type=END,FAIL",
        "--signal=B:USR1@60",
        "--dependency=afterok:123",
        "--gres=gpu:a100:4",
        "--exclude=n[1-2]",
        "--begin=now+1hour",
    ):
        assert parse_directive(directive)[0] == directive[2:].split("=")[0]


# Every field that becomes part of a line of the script, with a newline (or NUL) in it.
INJECTIONS = [
    ({"image": "img\n#SBATCH --uid=0"}, "image"),
    ({"command": ["echo", "a\nrm -rf /"]}, "command"),
    ({"command": ["echo", "a\rb"]}, "command"),
    ({"command": ["echo\0"]}, "command"),
    ({"command": None, "python_script": "/a.py\nrm -rf /"}, "python_script"),
    ({"command": None, "notebook": "/a.ipynb\nrm"}, "notebook"),
    ({"command": None, "notebook": "/a.ipynb", "args": ["x\ny"]}, "args"),
    ({"time": "10\n#SBATCH --uid=0"}, "time"),
    ({"partition": "debug\n#SBATCH --uid=0"}, "partition"),
    ({"account": "acct\nx"}, "account"),
    ({"qos": "q\nx"}, "qos"),
    ({"reservation": "r\nx"}, "reservation"),
    ({"job_name": "name\n#SBATCH --uid=0"}, "job_name"),
    ({"modules": ["openmpi-pmix\n"]}, "modules"),
    ({"environment": {"A\nB": "1"}}, "environment"),
    ({"environment": {"A": "1\nrm -rf /"}}, r"environment\[A\]"),
    ({"environment": {"A": "1\0"}}, r"environment\[A\]"),
    ({"workdir": "/work\nrm -rf /"}, "workdir"),
    ({"extra_directives": ["--mem=4G\n#SBATCH --uid=0"]}, "extra_directives"),
    ({"mode": "per-process\n"}, "mode"),
    ({"notebook_magics": "comment\n"}, "notebook_magics"),
]


@pytest.mark.parametrize("changes, field", INJECTIONS, ids=[f for _, f in INJECTIONS])
def test_a_newline_in_any_field_is_refused_naming_the_field(changes, field):
    with pytest.raises(JobSpecError, match=f"^{field}"):
        spec(**changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"image": "Not A Valid/Ref"}, "^image: invalid image reference"),
        ({"partition": "de bug"}, "^partition 'de bug' is not a valid Slurm name"),
        ({"account": "a;b"}, "^account 'a;b' is not a valid Slurm name"),
        ({"job_name": "x'y"}, "is not a valid Slurm name"),
        ({"environment": {"1A": "x"}}, "is not a valid variable name"),
        ({"environment": {"PATH": "/x"}}, "PATH cannot be set"),
        ({"environment": {"A": None}}, r"environment\[A\] must be a string"),
        ({"environment": ["A=1"]}, "environment must be a mapping"),
        ({"workdir": "relative/dir"}, "workdir must be an absolute path"),
        ({"mode": "shared"}, "mode must be one of podman-exec, per-process"),
        ({"modules": ["a b"]}, "modules: 'a b' is not a module name"),
    ],
)
def test_values_slurm_or_the_shell_would_misread_are_refused(changes, message):
    with pytest.raises(JobSpecError, match=message):
        spec(**changes)


def test_partitions_may_be_a_list_and_names_may_have_slurm_punctuation():
    job = spec(
        partition="debug,regular", account="m1234_g", qos="normal", reservation="resv.1", job_name="my-job_1.2+x@y:z"
    )
    assert job.partition == "debug,regular"


def test_modules_are_checked_against_the_site():
    assert [m.name for m in spec(modules=["openmpi-pmix", "scratch"]).check_modules(SITE_MODULES)] == [
        "openmpi-pmix",
        "scratch",
    ]
    with pytest.raises(JobSpecError, match=r"^modules: unknown module 'nope'"):
        spec(modules=["nope"]).check_modules(SITE_MODULES)
    with pytest.raises(JobSpecError, match=r"^modules: module 'openmpi-pmix' .* conflicts with 'openmpi-pmi2'"):
        spec(modules=["openmpi-pmix", "openmpi-pmi2"]).check_modules(SITE_MODULES)
    with pytest.raises(JobSpecError, match="always runs one container per node"):
        spec(modules=["mpich"], mode="per-process").check_modules(SITE_MODULES)


def test_from_dict_refuses_unknown_fields_and_a_missing_image():
    with pytest.raises(JobSpecError, match="unknown job specification field 'nodez'"):
        JobSpec.from_dict({"image": IMAGE, "command": ["true"], "nodez": 2})
    with pytest.raises(JobSpecError, match="image is required"):
        JobSpec.from_dict({"command": ["true"]})


def test_replace_validates_again():
    with pytest.raises(JobSpecError, match="nodes must be between"):
        spec().replace(nodes=0)


def test_a_notebook_s_parameters_are_python_literals():
    job = JobSpec(image="localhost/x:1", notebook="/a.ipynb", parameters={"alpha": " 0.5", "name": "'b'"})
    assert job.parameters == {"alpha": "0.5", "name": "'b'"}
    assert JobSpec.from_dict(job.as_dict()) == job
    with pytest.raises(JobSpecError, match=r"^parameters: name=b is not a Python literal"):
        JobSpec(image="localhost/x:1", notebook="/a.ipynb", parameters={"name": "b"})
