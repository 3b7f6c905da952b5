"""``dfmp2 compare``: the command (its options and output); the comparison itself (devices,
runs, the summary, table and JSON) is dfmp2.workflows.compare."""

from __future__ import annotations

import math

import click

from dfmp2 import linalg
from dfmp2.cli.options import (
    device_options,
    fail,
    json_option,
    molecule_options,
    one_process,
    printing,
    resource_options,
    run_options,
    scf_options,
    stdout_console,
    user_errors,
)
from dfmp2.errors import InputError
from dfmp2.io.xyz import read_xyz
from dfmp2.linalg.cpu_pair import AUTO_RULE as CPU_AUTO_RULE
from dfmp2.linalg.cuda import AUTO_RULE
from dfmp2.workflows.compare import (
    EXIT_DIFFERENT,
    TOLERANCES,
    DeviceRun,
    check_cuda_only,
    check_device,
    compare_molecule,
    compare_runs,
    compare_synthetic,
    document,
    parse_devices,
    rank_devices,
    refuse_unavailable,
    render,
    request_content,
    write_json,
)


@click.command("compare")
@click.argument("xyz_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--devices",
    default=None,
    help="comma-separated devices; the first that runs is the reference [default: the "
    "devices present here: cpu, plus cuda with a GPU, trn1/trn2 on Trainium in fp32]",
)
@click.option(
    "--synthetic",
    default=None,
    metavar="NOCC,NVIR,NAUX",
    help="a Philox synthetic pair-step problem instead of a molecule",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**64 - 1),
    default=0,
    show_default=True,
    help="seed of the synthetic problem (Philox, 0 to 2^64-1)",
)
@molecule_options()
@device_options(
    skip=("device",),
    precision={"default": "fp64", "help": "working precision on every device (trn needs fp32)"},
    pair_kernel={
        "help": f"the MP2 pair-step path of the devices that have it (cuda: gemm+epilogue, fused; cpu: "
        f"gemm+epilogue, gemm+torch); auto: cuda {AUTO_RULE}; cpu {CPU_AUTO_RULE}"
    },
    integrals={
        "help": "molecules: the 3-center integral engine (gpu4pyscf applies to the cuda devices; "
        "auto: gpu4pyscf on cuda when importable, else host); the JSON's 'ran' says which ran"
    },
)
@scf_options()
@resource_options(memory_mb={"help": "memory limit of each run, e.g. 8GB [default: 80% of available]"})
@click.option(
    "--repeat",
    type=click.IntRange(1, 100),
    default=2,
    show_default=True,
    help="runs per device, to check that its energies are bit-identical run to run",
)
@click.option(
    "--tol", "tolerance", type=float, default=None, help="allowed |ΔE_corr| in Hartree [default: 1e-10 fp64, 1e-6 fp32]"
)
@json_option("also write every device's energies (with float.hex) as JSON")
@user_errors
def compare_command(xyz_file, devices, synthetic, seed, repeat, tolerance, json_path, **params):
    """Run one problem on several devices from identical inputs and compare the energies bit by bit.

    XYZ_FILE is a molecule (coordinates in Ångström); or give --synthetic NOCC,NVIR,NAUX.
    Under torchrun a molecule's runs (each device, each repeat) are dealt to the ranks.
    Exit status: 0 agreement, 1 a difference beyond --tol or a device not bit-reproducible run to
    run, 2 bad input or a requested device that could not run.
    """
    if synthetic is not None:  # a pair step of seconds whose times are the point: one process
        one_process(
            "compare --synthetic",
            "its pair step takes seconds and its times are the point; ranks sharing a machine would only distort them",
        )
    from dfmp2 import distributed

    world = distributed.join("cpu")  # several ranks: the runs dealt to them, gloo gathers the energies
    with distributed.command(world):
        code = _compare(world, xyz_file, devices, synthetic, seed, repeat, tolerance, json_path, params)
    if code:  # every rank the same verdict, after leaving the group in order
        raise SystemExit(code)


def _compare(world, xyz_file, devices, synthetic, seed, repeat, tolerance, json_path, params) -> int:  # noqa: PLR0913
    """``compare`` on this rank (every rank checks everything and runs its share of the runs; rank
    0 alone prints and writes); the exit status."""
    console = stdout_console(json_path)  # JSON on stdout: the tables on stderr
    with world.agreeing():  # a refusal on one rank ends every rank, before any work
        if (xyz_file is None) == (synthetic is None):
            raise InputError("give either an XYZ file or --synthetic NOCC,NVIR,NAUX (not both)")
        options = run_options(params)  # options.device: each of the devices in turn
        precision = options.precision
        absent = {}
        if devices is None:
            names, absent = linalg.present_devices(precision)  # --devices' default
            if not world.rank:
                with printing():
                    console.print(
                        f"devices: {', '.join(names)} (present here)"
                        + ("; not present: " + "; ".join(f"{d} ({why})" for d, why in absent.items()) if absent else "")
                        + ". Name devices with --devices to require them.",
                        highlight=False,
                    )
        else:
            names = parse_devices(devices)
        tol = TOLERANCES[precision] if tolerance is None else tolerance
        if not 0 < tol < math.inf:
            raise InputError(f"--tol must be a positive finite number, got {tolerance}")
        check_cuda_only(options, names)
        if json_path is not None and not world.rank:  # before any work: a JSON that cannot be written fails now
            from dfmp2.io.outputs import check_output_file

            check_output_file(json_path, "--json", not_same_as=[("input", xyz_file)])
        on_rank = rank_devices(names, world)  # over several ranks: cuda is each rank's own GPU
        backends = {
            d: check_device(on_rank[d], precision, options.simulate, options.pair_kernel, options.cpu_blas)
            for d in names
        }
        refuse_unavailable(backends, on_rank, world)  # several ranks: before any work, not 'not run'
        geom = read_xyz(xyz_file) if synthetic is None else None
    if geom is not None:
        world.agree(None, request_content(geom, options, names, repeat, tol))  # the same molecule and options
    runs = [DeviceRun(d, status="not run", reason=reason) for d, (be, reason) in backends.items() if be is None]
    ready = [d for d, (be, _) in backends.items() if be is not None]
    if synthetic is not None:
        title, problem_doc, ran = compare_synthetic(
            synthetic, seed, precision, repeat, {d: backends[d][0] for d in ready}
        )
    else:
        title, problem_doc, ran = compare_molecule(
            xyz_file, options, repeat, {d: on_rank[d] for d in ready}, world=world, geom=geom
        )
    runs = sorted(runs + ran, key=lambda r: names.index(r.device))
    summary = compare_runs(runs, tol)
    code = 0 if summary["passed"] else EXIT_DIFFERENT
    if world.rank:  # rank 0 alone writes and prints
        return code
    if json_path:  # before the table: a stdout that fails must not lose the result
        doc = document(problem_doc, precision, repeat, devices, absent, summary, runs, world_size=world.size)
        write_json(json_path, doc)
    with printing(written=(json_path,)):
        render(runs, summary, title, console, world_size=world.size)
    if summary["not_run"]:  # the reasons on stderr too, not only in the table above (one process only)
        fail("not run: " + "; ".join(f"{r.device} ({r.reason})" for r in runs if r.status != "ran"))
    return code
