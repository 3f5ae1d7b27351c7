"""The podman command builder and option parsing (no podman needed)."""

from jupyter_podman_hpc.engine.podman import (
    Podman,
    group_options,
    option_values,
    parse_options,
    split_at_image,
    split_short_flags,
)
from jupyter_podman_hpc.engine.site.config import load_config

HELP = """\
Options:
  -a, --attach strings        Attach to STDIN, STDOUT or STDERR
  -d, --detach                Run container in background
  -e, --env stringArray       Set environment variables in container
      --env-host              Use all current host environment variables in container
  -i, --interactive           Keep STDIN open even if not attached
      --rm                    Remove container after exit
  -t, --tty                   Allocate a pseudo-TTY
  -v, --volume stringArray    Bind mount a volume
  -w, --workdir string        Working directory inside the container
"""


def test_parse_options_knows_which_flags_take_values():
    table = parse_options(HELP)
    assert table["-e"] and table["--env"] and table["-w"] and table["--attach"]
    assert not table["--rm"] and not table["-i"] and not table["--env-host"]


def test_split_at_image_finds_the_image_after_options():
    table = parse_options(HELP)
    options, image, command = split_at_image(
        ["-e", "A=1", "--rm", "-it", "--gpu", "-v", "/a:/b", "--env=B=2", "img:1", "ls", "-e", "x"],
        table,
        flags=["--gpu"],
    )
    assert options == ["-e", "A=1", "--rm", "-it", "--gpu", "-v", "/a:/b", "--env=B=2"]
    assert image == "img:1" and command == ["ls", "-e", "x"]
    assert split_at_image(["--rm"], table) == (["--rm"], None, [])


def test_group_options_pairs_flags_with_values():
    assert group_options(["-e", "A=1", "--rm", "-w/x", "--env=B"], parse_options(HELP)) == [
        ["-e", "A=1"],
        ["--rm"],
        ["-w/x"],
        ["--env=B"],
    ]


def test_grouped_short_flags_are_split_as_podman_reads_them():
    table = {"-i": False, "-t": False, "-e": True, "-w": True}
    assert split_short_flags([["-it"], ["-eA=1"], ["-e", "B=2"], ["--tty"]], table) == [
        ["-i"],
        ["-t"],
        ["-e", "A=1"],
        ["-e", "B=2"],
        ["--tty"],
    ]


def test_option_values_read_every_spelling_podman_accepts():
    table = parse_options(HELP)
    words = ["-v", "/a:/b", "-v/c:/d", "-v=/e:/f", "--volume=/g:/h", "-iv", "/i:/j", "-it", "-eX=1", "--rm"]
    assert option_values(words, table) == [
        ("-v", "/a:/b"),
        ("-v", "/c:/d"),
        ("-v", "/e:/f"),
        ("--volume", "/g:/h"),
        ("-i", ""),
        ("-v", "/i:/j"),
        ("-i", ""),
        ("-t", ""),
        ("-e", "X=1"),
        ("--rm", ""),
    ]
    assert split_at_image([*words, "img", "-v", "/x:/y"], table)[1:] == ("img", ["-v", "/x:/y"])


def test_commands_carry_the_hpc_storage_settings(tmp_path):
    squash, extra = tmp_path / "sq", tmp_path / "extra"
    extra.mkdir()
    config = load_config({"SQUASH_DIR": str(squash), "PODMANHPC_ADDITIONAL_STORES": f"{extra},{tmp_path}/none"})
    podman = Podman(config, {})
    run = podman.command("run", "--rm", "img")
    assert run[:5] == ["podman", "--root", config.graph_root, "--runroot", config.run_root]
    # the user's store is made on first use; a missing site store is left out (podman would refuse)
    assert f"additionalimagestore={squash},{extra}" in run and "ignore_chown_errors=true" in run
    assert squash.is_dir()
    assert f"mount_program={config.mount_program}" in run
    pull = podman.command("pull", "img")
    assert not any(a.startswith("additionalimagestore") for a in pull)  # writes never see the store
    assert not any(a.startswith("additionalimagestore") for a in podman.command(["system", "reset"]))
    assert any(a.startswith("additionalimagestore") for a in podman.command(["system", "service"]))


def test_only_commands_that_see_the_store_make_it(tmp_path):
    squash = tmp_path / "sq"
    podman = Podman(load_config({"SQUASH_DIR": str(squash)}), {})
    podman.command("pull", "img")
    podman.help_command("run")
    assert not squash.exists()
    podman.command("images")
    assert squash.is_dir()


def test_run_defaults_disable_seccomp_as_podman_hpc_does():
    assert "seccomp=unconfined" in Podman(load_config({}), {}).run_defaults()


def test_without_default_args_only_user_settings_remain():
    config = load_config({"PODMANHPC_USE_DEFAULT_ARGS": "false"})
    assert "--root" not in Podman(config, {}).command("run", "img")


def test_builders_for_remove_exec_and_help():
    podman = Podman(load_config({"PODMANHPC_USE_DEFAULT_ARGS": "false", "PODMANHPC_PODMAN_BIN": "/x/podman"}), {})
    assert podman.remove_command("a", "b")[-7:] == ["rm", "--force", "--ignore", "--time", "0", "a", "b"]
    assert podman.exec_command("c", ["ls", "-l"], ["-e", "A=1"])[-6:] == ["exec", "-e", "A=1", "c", "ls", "-l"]
    assert podman.help_command("run") == ["/x/podman", "run", "--help"]
    assert podman.help_command() == ["/x/podman", "--help"]
    assert podman.remove_containers() is None  # nothing to remove: podman is not run
