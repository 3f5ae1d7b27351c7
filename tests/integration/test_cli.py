"""The podman-hpc console script on the real stack: what a new user types first."""


def test_log_level_debug_shows_each_command_the_engine_runs(hpc, stack):
    quiet = hpc("images")
    assert "podman-hpc DEBUG" not in quiet.stderr
    loud = hpc("--log-level", "debug", "images")
    lines = [line for line in loud.stderr.splitlines() if line.startswith("podman-hpc DEBUG: ")]
    assert any(" --root " in line and " images --format json: exit 0 after " in line for line in lines), loud.stderr
    assert loud.stdout == quiet.stdout


def test_an_image_named_with_its_transport_is_pulled_squashed_and_run(hpc, stack):
    image = f"docker://{stack.tiny_image}"
    pulled = hpc("pull", image)
    assert f"squashed: {image}" in pulled.stdout
    hpc.wipe_local_storage()
    assert "already squashed" in hpc("migrate", image).stdout
    assert hpc("run", "--rm", image, "echo", "ran").stdout.strip() == "ran"
