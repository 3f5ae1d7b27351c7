"""Parsing %podman_hpc lines: subcommands, options, the submit target forms, errors with usage."""

import pytest

from jupyter_podman_hpc.magics.parser import SUMMARY, HelpRequested, MagicError, parse


def usage_error(line: str) -> MagicError:
    with pytest.raises(MagicError) as caught:
        parse(line)
    return caught.value


def test_build_options():
    args = parse("build -t localhost/x:1 --build-arg A=1 --build-arg B=x=y --context /ctx --squash --no-cache")
    assert (args.command, args.tag, args.build_args, args.context, args.squash, args.no_cache, args.debug) == (
        "build",
        "localhost/x:1",
        [("A", "1"), ("B", "x=y")],
        "/ctx",
        True,
        True,
        False,
    )
    assert parse("build --tag x").file is None


def test_build_needs_a_tag_and_key_value_arguments():
    error = usage_error("build")
    assert "the following arguments are required: -t/--tag" in error.message
    assert error.usage.startswith("usage: %%podman_hpc build -t NAME")
    error = usage_error("build -t x --build-arg NOVALUE")
    assert error.message == "argument --build-arg: --build-arg needs KEY=VALUE, not 'NOVALUE'"


@pytest.mark.parametrize(
    "line, command, image",
    [
        ("pull registry/img:1", "pull", "registry/img:1"),
        ("squash img", "squash", "img"),
        ("migrate img", "migrate", "img"),
        ("rmsqi img", "rmsqi", "img"),
    ],
)
def test_image_commands(line, command, image):
    args = parse(line)
    assert (args.command, args.image) == (command, image)


def test_pull_no_squash_and_images_filter():
    assert parse("pull img --no-squash").no_squash is True
    assert parse("images").filter is None and parse("images base").filter == "base"


def test_run_keeps_its_words_for_the_cli_parser():
    args = parse("run --rm --gpu -e A=1 img sh -c 'echo $A; exit 2' --debug")
    assert args.command == "run" and args.args == [
        "--rm",
        "--gpu",
        "-e",
        "A=1",
        "img",
        "sh",
        "-c",
        "echo $A; exit 2",
        "--debug",
    ]
    assert parse("--debug run img").debug is True


def test_submit_with_a_command_keeps_the_command_whole():
    args = parse(
        "submit --nodes 4 -n 2 --time 10:00 -p debug -A m123 --module openmpi-pmix --module scratch "
        "--mode per-process --env A=1 --env HOME --directive=--exclusive img python3 -c 'print(1)' "
        "--nodes 3"
    )
    assert (args.nodes, args.tasks_per_node, args.time, args.partition, args.account) == (
        4,
        2,
        "10:00",
        "debug",
        "m123",
    )
    assert args.modules == ["openmpi-pmix", "scratch"] and args.mode == "per-process"
    assert args.env == [("A", "1"), ("HOME", None)] and args.directives == ["--exclusive"]
    assert args.image == "img" and args.argv == ["python3", "-c", "print(1)", "--nodes", "3"]
    assert args.notebook is None and args.script is None and args.args == [] and args.preview is False
    assert parse("submit --ntasks-per-node 3 img true").tasks_per_node == 3


@pytest.mark.parametrize(
    "line",
    ["submit img --notebook nb.ipynb a b", "submit img --notebook=nb.ipynb a b", "submit --notebook nb.ipynb img a b"],
)
def test_submit_a_notebook_after_or_before_the_image(line):
    args = parse(line)
    assert (args.image, args.notebook, args.script, args.argv, args.args) == ("img", "nb.ipynb", None, [], ["a", "b"])


def test_submit_a_notebook_with_parameters():
    args = parse("submit --param alpha=0.5 img --notebook nb.ipynb --param \"name='x y'\" --param=n=2 arg --param b=1")
    # --param right after --notebook PATH is a parameter; after the notebook's first argument, an argument
    assert args.params == [("alpha", "0.5"), ("name", "'x y'"), ("n", "2")]
    assert args.args == ["arg", "--param", "b=1"]
    with pytest.raises(MagicError, match="--param needs KEY=VALUE, not 'oops'"):
        parse("submit img --notebook nb.ipynb --param oops")
    assert parse("submit img --notebook nb.ipynb --param a=1").params == [("a", "1")]
    assert parse("submit img true").params == []  # nothing left over from the parses before
    args = parse("submit --param alpha=0.5 --param \"name='x y'\" --notebook nb.ipynb img")
    assert args.params == [("alpha", "0.5"), ("name", "'x y'")] and args.notebook == "nb.ipynb"


def test_submit_a_script_and_preview():
    args = parse("submit --preview img --script run.py --flag")
    assert (args.script, args.args, args.preview, args.argv) == ("run.py", ["--flag"], True, [])
    assert parse("submit img -- --not-an-option").argv == ["--not-an-option"]


@pytest.mark.parametrize(
    "line, message",
    [
        ("submit img", "give the command to run after IMAGE (or --notebook PATH, --script PATH)"),
        ("submit --script a.py img --notebook b.ipynb", "give one of a command, --notebook and --script"),
        ("submit img --script", "--script needs a PATH"),
        ("submit --nodes four img true", "argument -N/--nodes: 'four' is not a whole number"),
        (
            "submit --mode fast img true",
            "argument --mode: invalid choice: 'fast' (choose from 'podman-exec', 'per-process')",
        ),
        ("submit --env 1A=2 img true", "argument -e/--env: --env needs NAME=VALUE or NAME, not '1A=2'"),
        ("logs 12x", "argument JOBID: '12x' is not a Slurm job id"),
        ("cancel", "the following arguments are required: JOBID"),
    ],
)
def test_submit_and_job_errors(line, message):
    error = usage_error(line)
    assert error.message == message
    assert error.usage.startswith(f"usage: %podman_hpc {line.split()[0]}")


def test_zero_nodes_parse_and_are_left_to_the_job_spec():
    assert parse("submit --nodes 0 img true").nodes == 0


def test_unknown_commands_and_options_show_the_usage():
    error = usage_error("frobnicate --now")
    assert error.message == "unknown command 'frobnicate'" and error.usage == SUMMARY.strip()
    error = usage_error("images --bogus")
    assert error.message == "unrecognized arguments: --bogus" and error.usage == "usage: %podman_hpc images [TEXT]"
    error = usage_error("--verbose images")
    assert error.message == "unknown option --verbose (options go after the command)"
    error = usage_error("run img echo 'unclosed")
    assert error.message.startswith("cannot split the line into words")


def test_kernel_actions():
    args = parse("kernel install img --name k1 --display-name 'My kernel' --module gpu --module home")
    assert (args.action, args.image, args.name, args.display_name, args.modules) == (
        "install",
        "img",
        "k1",
        "My kernel",
        ["gpu", "home"],
    )
    assert parse("kernel list").action == "list" and parse("kernel remove k1").name == "k1"
    assert usage_error("kernel").message == "kernel needs an action: install, list or remove"
    assert "invalid choice: 'erase'" in usage_error("kernel erase k1").message


@pytest.mark.parametrize("line", ["", "  ", "--help", "-h", "help"])
def test_help_is_the_summary(line):
    with pytest.raises(HelpRequested) as caught:
        parse(line)
    assert caught.value.text == SUMMARY


@pytest.mark.parametrize("line", ["help submit", "submit --help", "submit -h"])
def test_help_of_a_command(line):
    with pytest.raises(HelpRequested) as caught:
        parse(line)
    assert caught.value.text.startswith("usage: %podman_hpc submit --nodes N")
    assert "--preview" in caught.value.text


def test_help_of_run_and_of_an_unknown_command():
    with pytest.raises(HelpRequested) as caught:
        parse("run --help")
    assert caught.value.text.startswith("usage: %podman_hpc run [podman run options]")
    assert usage_error("help nothing").message == "no command 'nothing'"


def test_debug_anywhere_among_the_options():
    assert parse("--debug squash img").debug is True
    assert parse("squash img --debug").debug is True
    assert parse("squash img").debug is False


def test_cluster_start_takes_the_job_options_of_submit():
    args = parse(
        "cluster start --nodes 4 --tasks-per-node 2 --time 10 --module openmpi-pmix --env A=1 --env B reg/image:1"
    )
    assert (args.command, args.action, args.image) == ("cluster", "start", "reg/image:1")
    assert (args.nodes, args.tasks_per_node, args.time, args.modules) == (4, 2, "10", ["openmpi-pmix"])
    assert args.env == [("A", "1"), ("B", None)] and args.timeout == 600 and args.controller_ip == "127.0.0.1"


def test_cluster_stop_and_list():
    assert parse("cluster stop").cluster_id is None
    assert parse("cluster stop 1a2b3c4d").cluster_id == "1a2b3c4d"
    assert parse("cluster stop --all").all and parse("cluster list --all").all


def test_cluster_needs_an_action_and_start_an_image():
    with pytest.raises(MagicError, match="cluster needs an action"):
        parse("cluster")
    with pytest.raises(MagicError, match="the following arguments are required: IMAGE"):
        parse("cluster start --nodes 2")
