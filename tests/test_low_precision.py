"""bfloat16 and fp8 in the driver under a real mpiexec: nccl-tests' names, every op exact
(#wrong 0) at 1-3 ranks, and what cannot reduce them (MPI, gloo's fp8, the GPU path's fp8) said
in one line."""

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
        *(f"# gloo skips -d {t}: gloo has no {n} all-reduce; it takes int8, int32, int64, uint8, float16, float32, "
          "float64, bfloat16" for t, n in [("int16", "int16"), ("uint16", "uint16"), ("uint32", "uint32"),
                                          ("uint64", "uint64"), ("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")]),
    ], proc.stdout
    types = [row[2] for row in table_rows(proc.stdout)]
    assert types.count("bfloat16") == 2 and types.count("f8e4m3") == 1 and types.count("float") == 3, proc.stdout


@pytest.mark.parametrize("name,dtype", [("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")])
def test_the_gpu_path_refuses_fp8_in_one_line_before_looking_for_a_gpu(name, dtype):
    """fp8 has no CuPy arrays and no kernel of ours: refused on a machine with or without a GPU
    (bfloat16 runs on the device where CuPy holds it: tests/test_bf16_kernel.py, tests/mpi/test_gpu.py)."""
    proc = run_mpi(1, ["-m", "bench", "--device", "gpu", "-d", name, "--log", "none"], timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"python -m bench: error: -d {name} needs --device cpu: CuPy has no {dtype} arrays, and no kernel of this "
        f"suite reduces {dtype} on the device"]


def test_tune_writes_a_bfloat16_table_without_native(tmp_path):
    table = tmp_path / "table.json"
    proc = run_mpi(2, ["-m", "bench", "tune", "-b", "1K", "-e", "4K", "-f", "4", "--repeats", "1", "-d", "bf16,float32",
                       "--algo", "native,ring,rd", "-o", str(table)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = json.loads(table.read_text())["rules"]
    assert {r["dtype"] for r in rules} == {"bfloat16", "float32", "*"}
    assert all(set(r["order"]) == {"ring", "rd"} for r in rules if r["dtype"] in ("bfloat16", "*"))
    assert all(set(r["order"]) == {"native", "ring", "rd"} for r in rules if r["dtype"] == "float32")


def test_pytorch_kernels_give_the_bits_of_ml_dtypes_for_every_bfloat16_value(monkeypatch):
    """Where PyTorch is installed, long bfloat16 vectors are added, multiplied and divided by its
    kernels (algorithms.ops): every one of the 65536 values against 64 others, and divided by
    the rank counts 2-9, must give the bits ml_dtypes' ufuncs give (NaN: a NaN), and PyTorch's
    profiler must see its operator run for each."""
    torch = pytest.importorskip("torch")
    import ml_dtypes
    import numpy as np
    from torch.profiler import ProfilerActivity, profile

    from algorithms.ops import TORCH_FROM, combiner, divider

    monkeypatch.delenv("ALLREDUCE_BF16_KERNEL", raising=False)

    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    a = np.repeat(every, 64)
    b = np.random.default_rng(0).permutation(a)
    assert a.size >= TORCH_FROM and torch.bfloat16

    def same(got, want):
        nan = np.isnan(want.astype(np.float32))
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])

    def ran(name, call):
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            call()
        assert sum(event.name == name for event in recorded.events()) == 1, name

    with np.errstate(all="ignore"):  # infinities and NaN among the values
        for op, ufunc, name in (("sum", np.add, "aten::add"), ("prod", np.multiply, "aten::mul")):
            out = np.empty_like(a)
            ran(name, lambda: combiner(np, op)(a, b, out))
            same(out, ufunc(a, b))
        for n in range(2, 10):
            out = np.empty_like(a)
            ran("aten::div", lambda: divider(np)(a, n, out))
            same(out, np.divide(a, n))


def kernel_used(ranks, algorithm, op, env=None):
    """Every rank's view of the kernel its bfloat16 all-reduce ran (tests/scripts/bf16_kernel_used.py)."""
    proc = run_mpi(ranks, ["tests/scripts/bf16_kernel_used.py", algorithm, op], timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("ranks,algorithm,op", [(2, "ring", "sum"), (3, "ring", "sum"), (2, "ring", "avg"),
                                                (2, "rd", "prod")])
def test_pytorch_reduces_bfloat16_where_installed_though_nothing_imported_it(ranks, algorithm, op):
    """PyTorch installed, not imported: the all-reduce loads it and its profiler sees its
    kernels run on every rank (avg: the division too), exact, the caller's 2 threads left as
    they were (the kernel runs on one: algorithms.ops)."""
    pytest.importorskip("torch")
    operators = {"sum": {"aten::add"}, "avg": {"aten::add", "aten::div"}, "prod": {"aten::mul"}}[op]
    views = kernel_used(ranks, algorithm, op, env={"ALLREDUCE_BF16_KERNEL": "auto"})
    assert len(views) == ranks
    for view in views:
        assert not view["torch_before"] and view["torch_after_first_call"], view
        assert set(view["aten"]) == operators and min(view["aten"].values()) >= 1, view
        assert view["first_exact"] and view["second_exact"] and view["threads_after"] == 2, view


def test_ml_dtypes_reduces_bfloat16_where_told_even_with_pytorch_imported():
    """ALLREDUCE_BF16_KERNEL=ml_dtypes: PyTorch is neither loaded nor run, imported or not."""
    pytest.importorskip("torch")
    for view in kernel_used(2, "ring", "avg", env={"ALLREDUCE_BF16_KERNEL": "ml_dtypes"}):
        assert not view["torch_after_first_call"] and view["aten"] == {}, view
        assert view["first_exact"] and view["second_exact"], view


def kernel_lines(ranks, algos, tmp_path, env=None):
    """(the header's "# Kernels:" lines, the JSON's kernels) of a bfloat16 run of ``algos``."""
    document = tmp_path / f"{algos}.json"
    proc = run_mpi(ranks, ["-m", "bench", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--algo", algos,
                           "-d", "bf16", "-J", str(document), "--log", "none", "--quiet"], timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line for line in proc.stdout.splitlines() if line.startswith("# Kernels:")}
    return lines, json.loads(document.read_text())["allreduce_bench"]["kernels"]


def test_ring_alone_and_beside_gloo_name_the_same_bfloat16_kernel(tmp_path):
    """The header and the JSON name PyTorch (its installed version) whether or not gloo, which
    imports it, runs too; told ml_dtypes, they name ml_dtypes."""
    pytest.importorskip("torch.distributed")
    from importlib.metadata import version

    auto = {"ALLREDUCE_BF16_KERNEL": "auto"}
    alone, beside = kernel_lines(2, "ring", tmp_path, auto), kernel_lines(2, "ring,gloo", tmp_path, auto)
    assert alone == beside
    (line,), kernels = alone
    assert line.startswith(f"# Kernels: bfloat16: PyTorch {version('torch')} (sum, prod, avg from 8192 elements"), line
    assert kernels["bfloat16"] == line.removeprefix("# Kernels: bfloat16: ")
    assert kernels["float32"] == f"NumPy {version('numpy')}" and kernels["float8_e4m3fn"].startswith("ml_dtypes ")
    (told,), kernels = kernel_lines(1, "ring", tmp_path, {"ALLREDUCE_BF16_KERNEL": "ml_dtypes"})
    assert told == f"# Kernels: bfloat16: ml_dtypes {version('ml_dtypes')} (ALLREDUCE_BF16_KERNEL=ml_dtypes)"
    assert kernels["bfloat16"] == told.removeprefix("# Kernels: bfloat16: ")
