"""Running a command from a test: text output, and on failure an assertion that shows it."""

import subprocess


def run(args, *, check=True, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    """Run a command with text output; on failure the assertion shows its output."""
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert result.returncode == 0, (
            f"{' '.join(map(str, args))} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result
