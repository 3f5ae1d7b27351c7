"""Where a task sits in its step, and what its per-process container gets from the step."""

from jupyter_podman_hpc.engine.run.stepcontext import step_context, step_env_args, tasks_per_node
from jupyter_podman_hpc.engine.site.config import load_config


def test_tasks_per_node_expands_slurm_counts():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]


def test_step_context_picks_this_nodes_count_and_names_never_collide():
    config = load_config({})
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "3",
        "SLURMD_NODENAME": "n2",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)",
        "SLURM_NODEID": "1",
    }
    context = step_context(config, env)
    assert (context.local_id, context.tasks_on_node) == (1, 2)
    other_step = step_context(config, {**env, "SLURM_STEP_ID": "4"})
    other_node = step_context(config, {**env, "SLURMD_NODENAME": "n3"})
    names = {c.container_name(1001) for c in (context, other_step, other_node)}
    assert len(names) == 3 and context.container_name(1001) != context.container_name(1002)


def test_per_process_containers_get_the_slurm_environment_only_in_a_step():
    config = load_config({})
    assert step_env_args(config, {}) == []
    assert "SLURM_*" in step_env_args(config, {"SLURM_STEP_ID": "0"})
