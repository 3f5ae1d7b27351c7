"""The unpack cache's policy (sweep): unused copies idle too long, made by a job that has
ended, over the budget, or released at their job's end go; copies in use never."""

from jupyter_podman_hpc.engine.mount.cache import cache_entries, sweep
from jupyter_podman_hpc.engine.site.readpath import ReadPathSettings
from tests.helpers.squash_files import age, made_copy, needs_squashfs


@needs_squashfs
def test_unused_copies_idle_past_the_limit_go_at_the_next_use_and_copies_in_use_never(tmp_path):
    cache = tmp_path / "cache"
    idle, held = made_copy(tmp_path, "idle"), made_copy(tmp_path, "held")
    idle.release()
    recent = made_copy(tmp_path, "recent")
    recent.release()
    age(idle, 31)
    age(held, 90)  # in use for an hour and a half: stays
    age(recent, 29)
    newcomer = made_copy(tmp_path, "new")  # the next mount-program call sweeps
    assert [key for key, _ in newcomer.removed] == [idle.key]
    assert {key for key, _, _ in cache_entries(cache)} == {held.key, recent.key, newcomer.key}
    assert not idle.root.exists() and (held.root / "etc" / "hello").read_text() == "held"
    settings = ReadPathSettings("auto", str(cache), 1024, 30.0, "")
    assert sweep(cache, settings) == []
    age(recent, 31)
    [(key, why)] = sweep(cache, settings)
    assert key == recent.key and why == "unused for 31.0 min, more than squash_unpack_idle_minutes (30)"
    held.release()
    newcomer.release()


@needs_squashfs
def test_a_copy_of_a_job_that_has_ended_goes_at_the_next_use_on_the_node(tmp_path):
    cache = tmp_path / "cache"
    old, running, mine = (
        made_copy(tmp_path, "old", job="10"),
        made_copy(tmp_path, "running", job="11"),
        made_copy(tmp_path, "mine", job="12"),
    )
    inside = made_copy(tmp_path, "inside", job="10")  # still held: the job's container has not gone yet
    for copy in (old, running, mine):
        copy.release()
    asked = []

    def ended(job: str) -> bool:
        asked.append(job)
        return job == "10"

    removed = sweep(cache, ReadPathSettings("auto", str(cache), 1024, 30.0, "12"), ended=ended)
    assert removed == [(old.key, "made by job 10, which has ended")]
    assert sorted(asked) == ["10", "11"]  # once per job, and never our own
    assert {key for key, _, _ in cache_entries(cache)} == {running.key, mine.key, inside.key}
    inside.release()


@needs_squashfs
def test_the_sweep_holds_the_copies_to_the_budget_oldest_unused_first(tmp_path):
    cache = tmp_path / "cache"
    made = [made_copy(tmp_path, name) for name in ("a", "b", "c", "d")]
    for copy in made[1:]:
        copy.release()
    for minutes, copy in zip((9, 8, 7, 1), made, strict=True):
        age(copy, minutes)
    size = cache_entries(cache)[0][1]
    budget = ReadPathSettings("auto", str(cache), 2.5 * size / 2**20, 30.0, "")
    removed = sweep(cache, budget)
    # a is the oldest but in use; b and c go, d (the newest) fits with a
    assert [key for key, _ in removed] == [made[1].key, made[2].key]
    assert all("over squash_unpack_login_max_mb" in why for _, why in removed)  # job "": a login node
    assert {key for key, _, _ in cache_entries(cache)} == {made[0].key, made[3].key}
    made[0].release()


@needs_squashfs
def test_a_jobs_last_step_releases_its_own_unused_copies_only(tmp_path):
    cache = tmp_path / "cache"
    own, held, other = (
        made_copy(tmp_path, "own", job="30"),
        made_copy(tmp_path, "held", job="30"),
        made_copy(tmp_path, "other", job="31"),
    )
    own.release()
    other.release()
    settings = ReadPathSettings("auto", str(cache), 1024, 30.0, "30")
    assert sweep(cache, settings, ended=lambda job: False) == []  # not without being asked
    removed = sweep(cache, settings, ended=lambda job: False, release_job=True)
    assert removed == [(own.key, "released at the end of job 30")]
    assert {key for key, _, _ in cache_entries(cache)} == {held.key, other.key}
    held.release()
