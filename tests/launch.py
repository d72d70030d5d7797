"""Start real MPI jobs from tests: `mpiexec` from the same environment as the test run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpiexec_path() -> str:
    """The mpiexec installed beside this Python (the `mpich` wheel), else the one on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: install the `mpich` extra or a system MPI")
    return found


def rank_env(**extra: str) -> dict[str, str]:
    """The environment for ranks: one BLAS thread each (ranks share the cores), repo importable."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def mpiexec(ranks: int, *args: str, timeout: float = 120, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python *args` on `ranks` MPI ranks; return the finished process (text output).

    The job runs in its own process group, so a job that outlives `timeout` is killed whole
    and no rank is left behind. With `check`, a non-zero exit fails with the job's output.
    """
    command = [mpiexec_path(), "-n", str(ranks), sys.executable, *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env or rank_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{' '.join(command)} ran past {timeout} s\n{stdout}\n{stderr}")
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}\n"
                             f"--- stdout\n{stdout}\n--- stderr\n{stderr}")
    return result


def mpich_segments() -> set[Path]:
    """MPICH's own shared-memory files. MPICH unlinks them at a clean exit, not when a job is
    killed, as the fault tests and a restarted test pool do."""
    return set(Path("/dev/shm").glob("mpich_shm_*"))


def remove_orphaned_mpich_segments(before: set[Path]) -> None:
    """Remove MPICH files that appeared since `before` and that no live process maps."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.rsplit(None, 1)[-1] for line in maps.read_text().splitlines()
                          if "/dev/shm/mpich_shm_" in line)
        except OSError:  # the process ended, or is not ours to read
            continue
    for path in mpich_segments() - before:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)
