"""bfloat16 and fp8 in the driver under a real mpiexec: nccl-tests' names, every op exact
(#wrong 0) at 1-3 ranks, and what cannot reduce them (MPI, gloo's fp8, the GPU path) said in
one line."""

import json

import pytest
from conftest import run_mpi

OURS = "ring,rd,oneshot,auto"  # every algorithm on these types: tests/mpi (exactness at 1-8 ranks)


def table_rows(stdout):
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("ranks,name,shown", [
    (1, "bf16", "bfloat16"), (2, "bfloat16", "bfloat16"), (3, "bfloat16", "bfloat16"),
    (1, "f8e4m3", "f8e4m3"), (2, "f8e4m3", "f8e4m3"), (3, "f8e4m3", "f8e4m3"),
    (1, "f8e5m2", "f8e5m2"), (2, "f8e5m2", "f8e5m2"), (3, "f8e5m2", "f8e5m2"),
])
def test_every_op_is_exact_in_low_precision(tmp_path, ranks, name, shown):
    document = tmp_path / "run.json"
    proc = run_mpi(ranks, ["-m", "bench", "-b", "8", "-e", "64K", "-f", "32", "-n", "2", "-w", "1", "-c", "1",
                           "--algo", OURS, "-o", "all", "-d", name, "-J", str(document), "--log", "none", "--quiet"],
                   timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert len(rows) == len(OURS.split(",")) * 5 * 3, proc.stdout  # every algorithm, op and size
    assert all(row[2] == shown and row[8] == "0" and row[12] == "0" for row in rows), proc.stdout
    results = json.loads(document.read_text())["results"]
    assert {r["type"] for r in results} == {shown} and {r["redop"] for r in results} == {"sum", "prod", "max", "min", "avg"}
    assert all(r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0 for r in results)


def test_mpi_says_in_one_line_that_it_has_no_bfloat16():
    proc = run_mpi(2, ["-m", "bench", "-b", "8", "-e", "8", "--algo", "mpi", "-d", "bf16", "--log", "none"], timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "python -m bench: error: --algo mpi: this MPI library has no bfloat16 (its MPI_BFLOAT16_T is MPI_DATATYPE_NULL)"]


def test_with_every_type_mpi_and_gloo_skip_what_they_lack_and_run_the_rest():
    pytest.importorskip("torch.distributed")
    proc = run_mpi(2, ["-m", "bench", "-b", "1K", "-e", "1K", "-n", "1", "-w", "1", "--algo", "mpi,gloo,ring",
                       "-d", "all", "-o", "sum", "--log", "none", "--quiet"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skips = [line for line in proc.stdout.splitlines() if " skips -d " in line]
    assert skips == [
        "# mpi skips -d bfloat16: this MPI library has no bfloat16 (its MPI_BFLOAT16_T is MPI_DATATYPE_NULL)",
        "# mpi skips -d f8e4m3: MPI has no float8_e4m3fn type",
        "# mpi skips -d f8e5m2: MPI has no float8_e5m2 type",
        *(f"# gloo skips -d {t}: gloo has no {n} all-reduce; it takes int8, uint8, int32, int64, float16, bfloat16, "
          "float32, float64" for t, n in [("int16", "int16"), ("uint16", "uint16"), ("uint32", "uint32"),
                                          ("uint64", "uint64"), ("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")]),
    ], proc.stdout
    types = [row[2] for row in table_rows(proc.stdout)]
    assert types.count("bfloat16") == 2 and types.count("f8e4m3") == 1 and types.count("float") == 3, proc.stdout


def test_the_gpu_path_refuses_low_precision_in_one_line():
    proc = run_mpi(1, ["-m", "bench", "--device", "gpu", "-d", "bf16", "--log", "none"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "python -m bench: error: -d bf16 needs --device cpu: CuPy has no bfloat16 arrays, so the GPU path cannot "
        "hold them (a GPU run has yet to verify one)")


def test_tune_writes_a_bfloat16_table_without_native(tmp_path):
    table = tmp_path / "table.json"
    proc = run_mpi(2, ["-m", "bench", "tune", "-b", "1K", "-e", "4K", "-f", "4", "--repeats", "1", "-d", "bf16,float32",
                       "--algo", "native,ring,rd", "-o", str(table)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = json.loads(table.read_text())["rules"]
    assert {r["dtype"] for r in rules} == {"bfloat16", "float32", "*"}
    assert all(set(r["order"]) == {"ring", "rd"} for r in rules if r["dtype"] in ("bfloat16", "*"))
    assert all(set(r["order"]) == {"native", "ring", "rd"} for r in rules if r["dtype"] == "float32")


def test_pytorch_kernels_give_the_bits_of_ml_dtypes_for_every_bfloat16_value():
    """Where PyTorch is imported, long bfloat16 vectors are added, multiplied and divided by its
    kernels (algorithms.ops): every one of the 65536 values against 64 others, and divided by
    the rank counts 2-9, must give the bits ml_dtypes' ufuncs give (NaN: a NaN)."""
    torch = pytest.importorskip("torch")
    import ml_dtypes
    import numpy as np

    from algorithms.ops import TORCH_FROM, combiner, divider

    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    a = np.repeat(every, 64)
    b = np.random.default_rng(0).permutation(a)
    assert a.size >= TORCH_FROM and torch.bfloat16

    def same(got, want):
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])

    with np.errstate(all="ignore"):  # infinities and NaN among the values
        for op, ufunc in (("sum", np.add), ("prod", np.multiply)):
            out = np.empty_like(a)
            combine = combiner(np, op)
            assert combine is not ufunc  # the PyTorch path is taken
            combine(a, b, out)
            same(out, ufunc(a, b))
        for n in range(2, 10):
            out = np.empty_like(a)
            divider(np)(a, n, out)
            same(out, np.divide(a, n))
