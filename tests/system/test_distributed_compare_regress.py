"""``dfmp2 regress`` and ``dfmp2 compare`` over several processes: their whole runs dealt
to the ranks (dfmp2.workflows.tasks), on CPU with gloo.

Each dealt run is a one-process run at the same threads per process, so the energies over 2 ranks
are bitwise those of one process. The refusals start the ranks as a Slurm or MPI launcher would
(RANK, WORLD_SIZE, ... set by hand, as tests/system/test_distributed.py does), so each rank's exit
status and stderr are seen.
"""

import json
from pathlib import Path

import pytest
import torch
from ranks import LIMIT_S, launch, torchrun

ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs" / "water.xyz"


@pytest.mark.heavy
def test_regress_over_two_ranks_equals_one_process(tmp_path):
    """Two of the smallest cases (HF, RHF; OH frozen core, UHF; 19 basis functions) dealt over 2
    ranks, one each: every case's energies bit for bit one process's; rank 0 alone prints the
    table and writes the JSON, which records the ranks."""
    docs = {}
    names = ["hydrogen_fluoride", "hydroxyl|cc-pvdz|cc-pvdz-ri|df|fc"]
    for ranks in (1, 2):
        out = tmp_path / f"regress-{ranks}.json"
        p, _ = torchrun(
            tmp_path, ranks, [*names, "--cpu-blas", "torch", "--json", str(out)], "regress", timeout=LIMIT_S
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.count("2/2 passed") == 1, p.stdout  # one table
        docs[ranks] = json.loads(out.read_text())
    one, two = docs[1], docs[2]
    assert [c["key"] for c in two["cases"]] == [c["key"] for c in one["cases"]]
    assert [c["ours"] for c in two["cases"]] == [c["ours"] for c in one["cases"]]  # floats: JSON keeps the bits
    assert one["meta"]["world_size"] == 1 and "ranks" not in one["meta"]
    assert two["meta"]["world_size"] == 2 and two["meta"]["ranks"]["cases_per_rank"] == [1, 1]


@pytest.mark.heavy
def test_regress_in_groups_of_two_ranks_equals_one_process(tmp_path):
    """4 ranks, --ranks-per-run 2: the two smallest cases each split over a group of 2 ranks (one
    case a group), every case's energies bit for bit one process's; the JSON records the groups."""
    docs = {}
    names = ["hydrogen_fluoride", "hydroxyl|cc-pvdz|cc-pvdz-ri|df|fc"]
    for ranks, extra in ((1, []), (4, ["--ranks-per-run", "2"])):
        out = tmp_path / f"regress-{ranks}.json"
        args = [*names, "--cpu-blas", "torch", *extra, "--json", str(out)]
        p, _ = torchrun(tmp_path, ranks, args, "regress", timeout=LIMIT_S)
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.count("2/2 passed") == 1, p.stdout  # one table
        docs[ranks] = json.loads(out.read_text())
    one, four = docs[1], docs[4]
    assert [c["ours"] for c in four["cases"]] == [c["ours"] for c in one["cases"]]
    assert four["meta"]["ranks"]["ranks_per_run"] == 2 and four["meta"]["ranks"]["cases_per_group"] == [1, 1]
    assert [c["ran"]["distributed"]["group_of_ranks"] for c in four["cases"]] == [[0, 1], [2, 3]]


@pytest.mark.heavy
def test_compare_over_two_ranks_equals_one_process(tmp_path):
    """Water / STO-3G on the CPU, 3 repeats dealt over 2 ranks (0, 1, 0): the one-process bits,
    run to run identical across the ranks; the JSON records the world size and each repeat's rank,
    the table says its times are not one process's."""
    docs, outs = {}, {}
    for ranks in (1, 2):
        out = tmp_path / f"compare-{ranks}.json"
        args = [str(WATER), "--basis", "sto-3g", "--devices", "cpu", "--repeat", "3", "--cpu-blas", "torch"]
        p, _ = torchrun(tmp_path, ranks, [*args, "--json", str(out)], "compare", timeout=LIMIT_S)
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.count("PASS") == 1, p.stdout
        docs[ranks], outs[ranks] = json.loads(out.read_text()), " ".join(p.stdout.split())
    (one,), (two,) = docs[1]["devices"], docs[2]["devices"]
    assert two["hex"] == one["hex"] and len(set(json.dumps(h) for h in two["hex"])) == 1
    assert [r["rank"] for r in two["ran_on"]] == [0, 1, 0] and [r["rank"] for r in one["ran_on"]] == [0, 0, 0]
    assert docs[1]["world_size"] == 1 and docs[2]["world_size"] == 2
    assert "not comparable with a one-process compare's times" in outs[2]
    assert "not comparable" not in outs[1]


def _refusals():
    cases = [
        pytest.param("regress", ["no_such_molecule"], {}, "no reference case matches", id="regress-no-case"),
        pytest.param(
            "compare",
            [str(WATER), "--basis", "sto-3g", "--devices", "cpu", "--repeat", "2"],
            {"DFMP2_TEST_FAULT": "task:1:refuse"},
            "test refusal at task on rank 1",
            id="compare-a-run-fails-on-rank-1",
            marks=pytest.mark.slow,  # tasks.deal's failure path, in the default channel through interaction
        ),
    ]
    cuda = pytest.param(
        "compare",
        [str(WATER), "--basis", "sto-3g", "--devices", "cpu,cuda"],
        {},
        "device cuda cannot run on rank 0 of 2",
        id="compare-cuda-on-cpu-ranks",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: cuda runs here"),
    )
    return [*cases, cuda]


@pytest.mark.heavy
@pytest.mark.parametrize("command,args,env,message", _refusals())
def test_refusals_over_two_ranks_are_one_line_and_exit_2(tmp_path, command, args, env, message):
    """A bad input, a device the ranks cannot run, a run that fails on one rank: every rank exits 2
    promptly, one error line in all, no traceback, no JSON."""
    res = launch(tmp_path, [[*args, "--json", str(tmp_path / "out.json")]] * 2, command, **env)
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = [ln for _, err, _ in res for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], res
    assert not any("Traceback" in err for _, err, _ in res), res
    assert max(t for _, _, t in res) < 60 and not (tmp_path / "out.json").exists()


def test_rank_devices_and_unavailable_devices():
    """cuda over several ranks is each rank's own GPU; a GPU index by hand and Trainium are refused
    naming --devices; a device a rank cannot run is refused there (one process: reported as not run)."""
    from dfmp2 import distributed
    from dfmp2.errors import InputError
    from dfmp2.workflows.compare import rank_devices, refuse_unavailable

    one, rank1 = distributed.World(), distributed.World(rank=1, size=2, local_rank=1)
    assert rank_devices(["cpu", "cuda:1"], one) == {"cpu": "cpu", "cuda:1": "cuda:1"}
    assert rank_devices(["cpu", "cuda"], rank1) == {"cpu": "cpu", "cuda": "cuda:1"}
    for bad in ("cuda:0", "trn1"):
        with pytest.raises(InputError) as e:
            rank_devices([bad], rank1)
        assert e.value.option == "devices"
    backends = {"cpu": (object(), ""), "cuda": (None, "no GPU here")}
    refuse_unavailable(backends, {"cpu": "cpu", "cuda": "cuda"}, one)
    with pytest.raises(InputError, match=r"device cuda cannot run on rank 1 of 2 \(cuda:1\): no GPU here"):
        refuse_unavailable(backends, {"cpu": "cpu", "cuda": "cuda:1"}, rank1)
