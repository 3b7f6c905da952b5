"""``dfmp2 run --profile`` (dfmp2.timing.Profile, TransferCounter): the counter sees what crosses
between the host and a device ('meta' stands for a device here), a CPU run moves 0 bytes in every
stage and part of the SCF, the SCF's cycles make the host wait for a few scalars a cycle (what a
device-resident loop allows), the record covers every stage the timings name, validates against
the result schema and prints; --profile of several runs is one error line."""

import json
from pathlib import Path

import pytest
import torch
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from json_schema import checked

from dfmp2.cli.main import main
from dfmp2.interfaces import api
from dfmp2.options import RunOptions
from dfmp2.timing import TransferCounter, moved

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = str(Path(__file__).resolve().parents[2] / "inputs" / "water.xyz")
REGIONS = {"jk", "diagonalize", "density", "diis", "checks"}
WAITS_PER_CYCLE = 5  # the energy, |g|, DIIS's error norm, a mixed SCF's fp32 noise: one each, and slack


def test_moved_names_each_direction():
    cpu, d0, d1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert (moved(cpu, d0), moved(d0, cpu), moved(d0, d1), moved(cpu, cpu), moved(d0, d0)) == (
        "h2d",
        "d2h",
        "d2d",
        None,
        None,
    )


def test_the_counter_counts_copies_to_a_device_and_the_hosts_waits():
    x = torch.ones(1000, dtype=torch.float64)
    with TransferCounter() as c:
        x.to("meta")  # 8000 bytes cross
        torch.empty(10, device="meta").copy_(torch.ones(10))  # 40 bytes (fp32)
        x.to(torch.float32)  # a cast on the host: nothing crosses
        float(x.sum())  # the host waits for a scalar (on the host: no bytes)
        torch.nonzero(x > 0)  # its shape depends on the data: a wait
    assert c.bytes == {"h2d": 8040, "d2h": 0, "d2d": 0}
    assert c.waits == 2 and c.ops >= 7


@pytest.fixture(scope="module")
def profiled():
    return api.run(WATER, RunOptions(basis="sto-3g"), profile=True)


def test_a_cpu_run_moves_no_bytes_in_any_stage_or_part(profiled):
    p = profiled.profile
    assert p["device"] == "cpu" and p["memcpy"] is None
    assert list(p["stages"]) == list(profiled.timings)
    rows = [*p["stages"].values(), *p["scf_regions"].values()]
    assert rows and all(r["h2d_bytes"] == r["d2h_bytes"] == r["d2d_bytes"] == 0 for r in rows)
    assert all(r["device_busy_s"] is None and r["memcpy_s"] is None for r in rows)  # the host is the device
    for stage, seconds in profiled.timings.items():
        assert p["stages"][stage]["wall_s"] == pytest.approx(seconds)
    assert p["stages"]["scf"]["ops"] > 0 and p["stages"]["pair"]["ops"] > 0
    assert 0 <= p["outside_stages_s"] < profiled.wall_s


def test_the_scf_parts_add_up_to_its_cycles(profiled):
    p, cycles = profiled.profile, profiled.ran["scf"]["iterations"]
    regions = p["scf_regions"]
    assert set(regions) == REGIONS and p["scf_cycles"] == cycles
    assert regions["checks"]["calls"] == cycles and regions["diis"]["calls"] == cycles - 1
    assert regions["diagonalize"]["calls"] == cycles + 1  # and the final check's
    assert regions["jk"]["calls"] == cycles + 2  # and the guess's, the final check's
    assert sum(r["wall_s"] for r in regions.values()) <= p["stages"]["scf"]["wall_s"]
    assert regions["jk"]["per_cycle_s"] == pytest.approx(regions["jk"]["wall_s"] / cycles)


def test_the_scf_waits_for_a_few_scalars_a_cycle(profiled):
    """The SCF loop stays on its device: per cycle the host waits for a handful of device results
    (the energy, the orbital gradient's norm, DIIS's error norm ...); a matrix read back or an
    .item() in a loop over blocks would add waits per cycle, and fails this."""
    p, cycles = profiled.profile, profiled.ran["scf"]["iterations"]
    waits = sum(r["host_waits"] for r in p["scf_regions"].values())
    assert 0 < waits <= WAITS_PER_CYCLE * cycles


def test_the_top_kernels_are_torch_ops_by_self_time(profiled):
    top = profiled.profile["top_kernels"]
    assert top and all(r["name"].startswith("aten::") for r in top[:3])
    assert [r["seconds"] for r in top] == sorted((r["seconds"] for r in top), reverse=True)
    assert not any(r["name"].startswith("dfmp2.") or r["name"] == "PythonDispatchMode" for r in top)


def test_run_profile_prints_its_tables_and_writes_a_valid_document(tmp_path):
    out = tmp_path / "w.json"
    r = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--profile", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "profile on cpu: stages" in r.output and "cycles by part" in r.output and "top kernels" in r.output
    d = checked(json.loads(out.read_text()))
    assert d["schema_version"] == "12" and set(d["profile"]["scf_regions"]) == REGIONS


def test_run_without_profile_records_none(tmp_path):
    out = tmp_path / "w.json"
    r = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert checked(json.loads(out.read_text()))["profile"] is None


def test_profile_of_a_basis_bracket_is_one_error_line():
    r = CliRunner().invoke(main, ["run", WATER, "--basis", "cc-pv[dt]z", "--profile"])
    assert_one_line_error(r, "--profile", "basis bracket")


def _event(name, start, end, device=True, meta=""):
    """An event as ``dfmp2.timing._raw_events`` gives it (times in µs)."""
    from types import SimpleNamespace

    return (name, device, start, end, 1, SimpleNamespace(metadata_json=lambda: meta))


def test_device_events_go_to_the_stage_and_part_whose_window_holds_their_start():
    """The CUDA half of the record, on events as torch.profiler gives them (times in µs): a stage's
    window ends at its marker, a part's is its own span; copies by direction with their bytes."""
    from dfmp2.timing import _device_events

    events = [
        _event("dfmp2.stage:scf", 100, 101, device=False),
        _event("dfmp2.stage:pair", 300, 301, device=False),
        _event("dfmp2.region:jk", 20, 60, device=False),
        _event("gemm_a", 10, 15),  # scf, no part
        _event("gemm_a", 30, 40),  # scf, jk
        _event("Memcpy HtoD (Pageable -> Device)", 45, 47, meta='"device": 0, "bytes": 4096, "x": 1'),
        _event("epilogue", 150, 250),  # pair
        _event("Memcpy DtoH (Device -> Pinned)", 260, 261),  # no bytes given
        _event("late", 400, 401),  # after the last stage
    ]
    d = _device_events(events)
    assert d["stages"]["scf"]["busy_s"] == pytest.approx((5 + 10 + 2) / 1e6)
    assert d["stages"]["scf"]["memcpy_s"] == pytest.approx(2 / 1e6)
    assert d["stages"]["pair"]["busy_s"] == pytest.approx(101 / 1e6)
    assert d["regions"]["jk"]["busy_s"] == pytest.approx(12 / 1e6) and set(d["regions"]) == {"jk"}
    assert "(after the last stage)" in d["stages"]
    assert d["memcpy"]["HtoD"] == {"calls": 1, "seconds": pytest.approx(2e-6), "bytes": 4096, "bytes_known": True}
    assert d["memcpy"]["DtoH"]["calls"] == 1 and not d["memcpy"]["DtoH"]["bytes_known"]
    top = d["kernels"]
    assert top[0]["name"] == "epilogue" and top[1] == {
        "name": "gemm_a",
        "calls": 2,
        "seconds": pytest.approx(15e-6),
        "share": pytest.approx(15 / 119),
    }


def test_a_gpu_profile_without_device_events_says_the_device_seconds_are_unknown():
    """CUDA activity that recorded nothing (no CUPTI) must not read as an idle device: the busy
    seconds are null and the record says why."""
    from types import SimpleNamespace

    from dfmp2.timing import Profile

    be = SimpleNamespace(device=torch.device("cpu"), caps=SimpleNamespace(cuda_memory=True))
    p = Profile(be)
    p.events = [("dfmp2.stage:scf", False, 0.0, 1.0, 1, None), ("aten::mm", False, 0.1, 0.5, 1, None)]
    p.stages = {"scf": {"wall_s": 1.0, "host_cpu_s": 1.0, "h2d": 8, "d2h": 0, "d2d": 0, "ops": 1, "waits": 0}}
    p.t_begin = p.t_enter = p.first_start = p.last_end = p.t_exit = p.stop_s = 0.0
    r = p.report({"scf": 1.0}, 2.0, None)
    assert r["device_events"] == 0 and "no CUDA events" in r["note"] and r["memcpy"] is None
    assert r["stages"]["scf"]["device_busy_s"] is None and r["stages"]["scf"]["h2d_bytes"] == 8
    assert r["top_kernels"][0]["name"] == "aten::mm" and "(no CUDA events)" in r["top_kernels_by"]


def test_gradient_profile_covers_the_energy_and_the_gradient_stage(tmp_path):
    out = tmp_path / "g.json"
    r = CliRunner().invoke(main, ["gradient", WATER, "--basis", "sto-3g", "--profile", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "the gradient stage" in r.output and r.output.count("profile on cpu: stages") == 2  # energy, gradient
    d = checked(json.loads(out.read_text()))
    g = d["gradient"]["profile"]
    assert set(d["gradient"]["timings"]) <= set(g["stages"]) and g["scf_regions"] == {}
    assert all(row["h2d_bytes"] == row["d2h_bytes"] == 0 for row in g["stages"].values())
    assert set(d["profile"]["scf_regions"]) == REGIONS  # the energy run's, as dfmp2 run --profile


def test_raw_events_drop_the_device_timelines_copies_of_our_markers():
    """Kineto draws a record_function span on the GPU's timeline too ('gpu_user_annotation'): it
    covers kernels already counted, and the stages' windows come from the host's markers."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from dfmp2.timing import _raw_events

    def ev(name, device, kind, t0, t1):
        return SimpleNamespace(
            name=lambda: name,
            device_type=lambda: device,
            activity_type=lambda: kind,
            start_ns=lambda: t0,
            end_ns=lambda: t1,
            start_thread_id=lambda: 7,
        )

    kinds = [
        ("dfmp2.region:jk", DeviceType.CPU, "user_annotation"),
        ("dfmp2.region:jk", DeviceType.CUDA, "gpu_user_annotation"),
        ("sm90_gemm", DeviceType.CUDA, "kernel"),
        ("aten::mm", DeviceType.CPU, "cpu_op"),
    ]
    raw = [ev(n, d, k, 1000, 3000) for n, d, k in kinds]
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: raw)))
    got = [(name, on_device, t0, t1) for name, on_device, t0, t1, _, _ in _raw_events(prof)]
    assert got == [("dfmp2.region:jk", False, 1.0, 3.0), ("sm90_gemm", True, 1.0, 3.0), ("aten::mm", False, 1.0, 3.0)]
