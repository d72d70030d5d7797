"""The explainer: its text, its pictures, its replay, its MPI mode, and the cost-model fit."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import collectives
from benchmarks import fit
from collectives import explain
from launch import ROOT, mpiexec, rank_env

EXPECTED = Path(__file__).parent / "expected"
SVG = "{http://www.w3.org/2000/svg}"
XHTML = "{http://www.w3.org/1999/xhtml}"


@pytest.fixture(autouse=True)
def ring_only(monkeypatch):
    monkeypatch.delenv("RINGCC_ONE_SHOT_BYTES", raising=False)


def run_explain(capsys, *argv: str) -> str:
    explain.main(list(argv))
    return capsys.readouterr().out


def test_all_reduce_on_4_ranks_matches_the_checked_in_text(capsys):
    out = run_explain(capsys, "all_reduce", "--ranks", "4", "--count", "8")
    assert out == (EXPECTED / "explain_all_reduce_4.txt").read_text()


def textbook_moves(size: int, step: int) -> set[tuple[int, int, str]]:
    """Frame `step` (1-based) of ring all-reduce: every rank r sends to r + 1 the chunk
    r - s of the reduce-scatter, then r + 1 - s of the all-gather."""
    s, first = (step - 1, 0) if step < size else (step - size, 1)
    return {(r, (r + 1) % size, f"chunk {(r + first - s) % size}") for r in range(size)}


def frames_of(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "frame"]


def moves_of(frame: ET.Element) -> set[tuple[int, int, str]]:
    return {(int(g.get("data-src")), int(g.get("data-dst")), g.get("data-label"))
            for g in frame.iter(f"{SVG}g") if g.get("class") == "move"}


@pytest.mark.parametrize("size", [2, 4, 5])
def test_the_svg_has_one_frame_per_step_with_the_ring_arrows(capsys, tmp_path, size):
    picture = tmp_path / "ring.svg"
    run_explain(capsys, "all_reduce", "--ranks", str(size), "--count", "11",
                "--svg", str(picture))
    frames = frames_of(ET.parse(picture).getroot())
    steps = 2 * (size - 1)
    assert [int(f.get("data-step")) for f in frames] == list(range(steps + 1))  # 0: the start
    assert moves_of(frames[0]) == set()
    for k in range(1, steps + 1):
        assert moves_of(frames[k]) == textbook_moves(size, k), f"step {k}"
    # Animated: each frame is shown in its own slice of the loop.
    for frame in frames:
        (animate,) = frame.iter(f"{SVG}animate")
        assert animate.get("attributeName") == "visibility"


def test_a_still_draws_one_frame(capsys, tmp_path):
    picture = tmp_path / "step.svg"
    run_explain(capsys, "all_reduce", "--ranks", "3", "--svg", str(picture), "--frame", "2")
    (frame,) = frames_of(ET.parse(picture).getroot())
    assert frame.get("visibility") == "visible" and not list(frame.iter(f"{SVG}animate"))
    assert moves_of(frame) == textbook_moves(3, 2)


def test_the_html_page_steps_through_the_same_frames(capsys, tmp_path):
    page = tmp_path / "ring.html"
    run_explain(capsys, "broadcast", "--ranks", "3", "--count", "6", "--root", "1",
                "--html", str(page))
    root = ET.parse(page).getroot()  # well-formed XHTML
    assert {b.get("id") for b in root.iter(f"{XHTML}button")} == {"prev", "next", "play"}
    frames = frames_of(root)
    # 3 segments down the chain 1 -> 2 -> 0: 3 + 3 - 2 steps, then the start.
    assert len(frames) == 5
    assert moves_of(frames[1]) == {(1, 2, "segment 0")}
    assert moves_of(frames[2]) == {(1, 2, "segment 1"), (2, 0, "segment 0")}
    assert [f.get("visibility") for f in frames] == ["visible"] + ["hidden"] * 4


CASES = [("all_reduce", 3, 7, "sum"), ("all_reduce", 5, 3, "avg"), ("all_reduce", 1, 4, "max"),
         ("all_gather", 4, 8, None), ("reduce_scatter", 3, 6, "avg"),
         ("reduce_scatter", 2, 4, "prod"), ("broadcast", 4, 9, None), ("scatter", 3, 6, None),
         ("scatter", 4, 0, None), ("naive_ring", 4, 5, "avg"),
         ("reduce_broadcast", 3, 4, "min"), ("all_reduce", 4, 0, "sum")]


@pytest.mark.parametrize("collective, size, count, op", CASES)
def test_the_replay_ends_where_the_collective_did(collective, size, count, op):
    setup = explain.Setup(collective, size, count, root=size - 1, op=op or "sum",
                          segment_bytes=16)
    names = explain.ALL_REDUCES if collective in explain.ALL_REDUCES else (collective,)
    per_rank = collectives.spawn(explain.run_rank, size, setup, names, segment_bytes=16)
    text, run = explain.explain(setup, json.loads(json.dumps(per_rank)), "threads")
    assert run.replay_matches and run.reference_matches, text
    assert "ends where the collective did, on every rank: yes" in text


def test_the_naive_algorithms_send_more_than_the_ring(capsys):
    out = run_explain(capsys, "naive_ring", "--ranks", "5", "--count", "10")
    ring, whole, via_root = out[out.index("all-reduce three ways"):].splitlines()[2:]
    # Most bytes one rank sends, with S = 80 bytes: 2(N-1)/N S for the ring, (N-1) S naive.
    assert ring.split()[:2] == ["all_reduce", "(ring)"] and "128 B = 1.6 S" in ring
    assert whole.split()[0] == "naive_ring" and "320 B = 4 S" in whole
    assert via_root.split()[0] == "reduce_broadcast" and "320 B = 4 S" in via_root


def test_on_real_mpi_ranks_the_schedule_is_the_same(capsys):
    argv = ["reduce_scatter", "--count", "6", "--op", "max"]
    job = mpiexec(3, "-m", "collectives.explain", *argv, "--transport", "mpi", timeout=90)
    threads = run_explain(capsys, *argv, "--ranks", "3")
    assert job.stdout == threads.replace("threads transport", "mpi transport")


LAYERS = ["lessons", "schedule", "run", "text", "picture", "cli"]


def explainer_imports(name: str) -> set[str]:
    """The modules of collectives.explain that its module `name` imports ("__init__": the
    package itself)."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / "collectives" / "explain" / f"{name}.py").read_text())):
        if isinstance(node, ast.Import):
            dotted = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ["collectives", "explain"][:3 - node.level] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            dotted = [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for parts in (d.split(".") for d in dotted):
            if parts[:2] == ["collectives", "explain"]:
                found.add(parts[2] if len(parts) > 2 else "__init__")
    return found


def test_the_explainer_imports_flow_one_way():
    """Each module of the explainer imports only modules before it in LAYERS, so none imports
    one that imports it back; and the picture module imports on its own."""
    for k, name in enumerate(LAYERS):
        assert explainer_imports(name) <= set(LAYERS[:k]), name
    subprocess.run([sys.executable, "-c", "import collectives.explain.picture"], cwd=ROOT,
                   env=rank_env(), check=True, timeout=60)


@pytest.mark.parametrize("ranks, node_size, count", [(2, 2, 4), (6, 3, 2), (4, 1, 3), (6, 2, 12)])
def test_the_hierarchical_average_is_replayed_where_every_rank_divides(capsys, ranks, node_size,
                                                                      count):
    """Every rank divides its shard once it is reduced over every node, whether or not it
    received in the last step across (one node; shards too small to cut across nodes): the
    replay divided only where it had, and ended on sums."""
    out = run_explain(capsys, "hierarchical", "--ranks", str(ranks), "--node-size",
                      str(node_size), "--count", str(count), "--op", "avg")
    assert out.count(": yes") == 2 and ": NO" not in out, out


def test_the_lessons_that_show_the_ring_run_it_whatever_auto_would_take(monkeypatch):
    """On more than 2 ranks that outnumber the cores, `auto` takes the two-shot algorithm from
    1 MiB chunks, whose sends all start at once: no steps of the ring to draw (the schedule
    found "a cycle of waits"). The all-reduce lesson asks for the ring; a reduce-scatter,
    which has no choice to make, is refused with the reason."""
    asked = {}

    class Recorder:
        def all_reduce(self, *args, **options):
            asked.update(options)

    setup = explain.Setup("all_reduce", 3, 6, 0, "sum", 48)
    explain.LESSONS["all_reduce"].run(Recorder(), explain.LESSONS["all_reduce"].start(0, setup),
                                      setup)
    assert asked["algorithm"] == "ring"
    monkeypatch.setattr("collectives.explain.run.two_shot_pays", lambda transport, sizes: True)
    setup = explain.Setup("reduce_scatter", 3, 6, 0, "sum", 48)
    with pytest.raises(collectives.InvalidArgumentError, match="takes the two-shot algorithm"):
        collectives.spawn(explain.run_rank, 3, setup, ("reduce_scatter",))


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        explain.main(["all_gather", "--count", "5"])  # not a multiple of 4 ranks
    with pytest.raises(SystemExit):
        explain.main(["all_gather", "--op", "sum"])
    with pytest.raises(SystemExit):
        explain.main(["scatter", "--root", "4"])
    for argv in (["hierarchical", "--ranks", "6", "--node-size", "0"],  # was taken as 2
                 ["all_reduce", "--segment-bytes", "0"],  # was taken as the default
                 ["all_reduce", "--segment-bytes", "-1"]):  # was a traceback
        with pytest.raises(SystemExit):
            explain.main(argv)
        assert "must be at least 1" in capsys.readouterr().err, argv


def test_a_run_the_transport_refuses_ends_with_the_reason_not_a_traceback():
    job = mpiexec(2, "-m", "collectives.explain", "hierarchical", "--node-size", "1",
                  "--transport", "mpi", timeout=90, check=False)
    assert job.returncode != 0 and "Traceback" not in job.stderr, job.stderr
    assert "explain: the hierarchical all-reduce needs the hierarchical transport" in \
        job.stdout + job.stderr, job.stdout + job.stderr


def synthetic(collective: str, a: float, b: float) -> list[dict]:
    rows = []
    for ranks in (2, 3, 4, 7):
        for nbytes in (8 * 4 ** k for k in range(12)):
            steps, moved = fit.MODELS[collective][1](ranks, nbytes, 1 << 20)
            rows.append({"impl": "ringcc:mpi", "collective": collective, "ranks": ranks,
                         "bytes": nbytes, "count": nbytes // 4, "dtype": "float32",
                         "time_us": steps * a + moved * b, "wrong": 0})
    return rows


# Each model's (steps, bytes on the critical path) on 5 ranks, S = 6400 bytes, segments of 1600
# bytes (m = 4), worked out by hand from the algorithms' docstrings (the fit below recovers a
# and b from any model, so the models themselves are pinned here).
BY_HAND = {"all_reduce": (8, 10240), "all_gather": (4, 5120), "reduce_scatter": (4, 5120),
           "broadcast": (7, 11200), "scatter": (5, 5120), "gather": (4, 5120),
           "reduce": (8, 10240), "all_to_all": (4, 5120), "scan": (3, 19200),
           "sendrecv": (1, 6400)}


def test_the_cost_models_are_the_algorithms_costs():
    assert set(BY_HAND) == set(fit.MODELS)
    for collective, want in BY_HAND.items():
        assert fit.MODELS[collective][1](5, 6400, 1600) == pytest.approx(want), collective


@pytest.mark.parametrize("collective", sorted(fit.MODELS))
def test_the_fit_recovers_known_latency_and_bandwidth(collective):
    result = fit.fit(synthetic(collective, a=23.0, b=4e-4))
    assert result.a == pytest.approx(23.0, rel=1e-9)
    assert result.b == pytest.approx(4e-4, rel=1e-9)
    assert max(map(abs, result.errors())) < 1e-9


def test_the_fit_command_prints_a_b_and_marks_rows_the_model_misses(tmp_path, capsys):
    rows = synthetic("all_reduce", a=20.0, b=5e-4)
    rows[0]["time_us"] *= 3  # one row far off the model
    path, again = tmp_path / "results.json", tmp_path / "again.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    rows[0]["time_us"] *= 2  # a repeated run: the fit keeps the fastest time of each size
    again.write_text(json.dumps({"meta": {}, "rows": rows}))
    assert fit.main([str(path), str(again)]) == 0
    out = capsys.readouterr().out
    assert "ringcc:mpi all_reduce" in out and "each the fastest of 2 runs" in out
    assert re.search(r"a = [\d.]+ us per step   b = [\d.]+ ns per byte", out)
    assert "* the model misses on 2 ranks at 8 B" in out
    assert "the ring beats recursive doubling above" in out
    assert fit.main([str(path), "--predict", "8,16"]) == 0
    assert "on 16 ranks the ring beats recursive doubling" in capsys.readouterr().out
    assert fit.main([str(path), "--impl", "gloo"]) == 2  # nothing to fit
