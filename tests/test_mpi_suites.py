"""Launch the multi-rank suites in tests/mpi under a real mpiexec, at several rank counts
(non-powers of two included; more ranks than cores is fine for correctness)."""

import json

import pytest
from conftest import cliques, run_mpi

from bench.baselines.gloo import problem as gloo_problem

RANK_COUNTS = [1, 2, 3, 5, 8]  # one rank, powers of two (2, 8) and not (3, 5)


#: the correctness suite's cases for the suites that vary the transport: one dtype of each item
#: size (the transports move bytes; every dtype runs on the default transport at every rank count),
#: and one algorithm of each way of using the transport: bamring runs the ring's exchanges, bamtree
#: and kmtree the tree's executor, and oneshot and twoshot their own windows, not the transport
#: the transport suites' dtypes, the smallest item size and the largest (int8, float64: what a
#: transport cuts into segments and slots depends on the item size alone; the correctness suite
#: runs every dtype), and the algorithms that use the transport their own way
SMALLEST_AND_LARGEST_ITEMS = ("not uint and not int16 and not int32 and not int64 and not bfloat16 and not float8"
                              " and not float16 and not float32"
                              " and not bamring and not bamtree and not kmtree and not oneshot and not twoshot")


def run_suite(ranks, path, tmp_path, timeout, env=None, select=None):
    """Run one suite on ``ranks`` ranks (only the tests that ``select``, a ``-k`` expression, picks);
    every rank must report its own pass (tests/mpi/conftest.py)."""
    reports = tmp_path / "reports"
    reports.mkdir()
    args = ["-m", "mpi4py", "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider",
            "-p", "no:hypothesispytest",  # no suite uses it; loading it costs each rank 0.6 s
            "-o", "addopts=", "-W", "error::pytest.PytestUnraisableExceptionWarning", path]
    args += ["-k", select] if select else []
    proc = run_mpi(ranks, args, timeout, {**(env or {}), "MPI_SUITE_REPORT_DIR": str(reports)})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{ranks} ranks: exit {proc.returncode}\n{output[-6000:]}"
    verdicts = [json.loads(p.read_text()) for p in sorted(reports.glob("rank*.json"))]
    assert sorted(v["rank"] for v in verdicts) == list(range(ranks)), output[-3000:]
    for v in verdicts:
        assert v["exitstatus"] == 0 and v["failed"] == 0 and v["error"] == 0 and v["passed"] > 0, v


@pytest.mark.parametrize("ranks", RANK_COUNTS)
def test_correctness_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_correctness.py", tmp_path, timeout=420)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8])
def test_compiled_engine_suite(ranks, tmp_path):
    """The compiled engine against the Python engine, bit for bit (tests/mpi/test_compiled.py)."""
    run_suite(ranks, "tests/mpi/test_compiled.py", tmp_path, timeout=300)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_auto_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_auto.py", tmp_path, timeout=180)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_bad_input_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_bad_input.py", tmp_path, timeout=120)


def test_staged_transport_suite(tmp_path):
    """The staged (host-copy) transport that CuPy uses without CUDA-aware MPI, exercised on NumPy,
    with 64 KiB segments so that long vectors take many pipelined (staged isend) messages, and
    16 KiB chunks so that every larger blocking message goes through the double-buffered pipeline."""
    run_suite(3, "tests/mpi/test_correctness.py", tmp_path, timeout=300,
              env={"ALLREDUCE_TRANSPORT": "staged", "ALLREDUCE_SEGMENT_BYTES": "65536",
                   "ALLREDUCE_STAGE_BYTES": "16384"}, select=SMALLEST_AND_LARGEST_ITEMS)


def test_direct_transport_suite(tmp_path):
    """Plain MPI point-to-point, which host buffers use between nodes (and device buffers with
    a CUDA-aware MPI); on one node the shared-memory transport is the default."""
    run_suite(3, "tests/mpi/test_correctness.py", tmp_path, timeout=300, env={"ALLREDUCE_TRANSPORT": "direct"},
              select=SMALLEST_AND_LARGEST_ITEMS)


def test_shared_memory_transport_suite_with_small_slots(tmp_path):
    """The shared-memory transport with 4 KiB slots and 16 KiB segments, so messages take
    several pieces and wait for free slots; messages under 64 B go through MPI in between,
    and those over 64 KiB (the parameter server's results) go by the sender's pages
    (``ALLREDUCE_SHM_BY_PAGES=1``): from NumPy's small arrays, in 4 KiB pages, through the
    slots; from its large ones, in huge pages, through MPI, announced. The other suites run
    the default, which on a machine with huge pages sends every large one through MPI."""
    run_suite(3, "tests/mpi/test_correctness.py", tmp_path, timeout=300,
              env={"ALLREDUCE_SHM_SLOT_BYTES": "4096", "ALLREDUCE_SHM_MIN_BYTES": "64",
                   "ALLREDUCE_SHM_MAX_BYTES": "65536", "ALLREDUCE_SEGMENT_BYTES": "16384",
                   "ALLREDUCE_SHM_BY_PAGES": "1"}, select=SMALLEST_AND_LARGEST_ITEMS)


def test_one_node_algorithms_across_nodes_suite(tmp_path):
    """oneshot and twoshot on ranks that span nodes (MPICH's cliques: nodes of ranks 0-1 and 2,
    messages between them on the loopback), where they run and bind their fallbacks (rd, the
    ring): exact in every dtype and op, repeated, persistent and in halves."""
    run_suite(3, "tests/mpi/test_correctness.py", tmp_path, timeout=180, env=cliques(2), select="oneshot or twoshot")


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_shared_memory_transport_on_its_own(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_transport.py", tmp_path, timeout=120)


@pytest.mark.skipif(gloo_problem() is not None, reason=gloo_problem() or "")
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_torch_hook_suite(ranks, tmp_path):
    """algorithms.torch's DDP hook against DDP's own gloo all-reduce (tests/mpi/test_torch_hook.py)."""
    run_suite(ranks, "tests/mpi/test_torch_hook.py", tmp_path, timeout=180)


@pytest.mark.skipif(gloo_problem() is not None, reason=gloo_problem() or "")
@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_torch_fsdp_suite(ranks, tmp_path):
    """algorithms.torch's FSDP2 all-gather and reduce-scatter against FSDP's own gloo ones
    (tests/mpi/test_torch_fsdp.py)."""
    run_suite(ranks, "tests/mpi/test_torch_fsdp.py", tmp_path, timeout=180)


@pytest.mark.parametrize("ranks", [3, 5])
def test_latency_halves_suite(ranks, tmp_path):
    """Rabenseifner's halves at radix 3, 4 and 64, Bruck's all-gather (tests/mpi/test_halves_latency.py)."""
    run_suite(ranks, "tests/mpi/test_halves_latency.py", tmp_path, timeout=180)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_registered_vectors_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_registered.py", tmp_path, timeout=240)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_twoshot_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_twoshot.py", tmp_path, timeout=120)


@pytest.mark.parametrize("ranks", [3, 5])
def test_dring_suite(ranks, tmp_path):
    """dring in the ranks' own order (on 1-2 ranks it is the ring; the correctness suite runs it
    in a matrix's order at every rank count)."""
    run_suite(ranks, "tests/mpi/test_dring.py", tmp_path, timeout=120)


def _gpus():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


@pytest.mark.skipif(_gpus() == 0, reason="no CUDA GPU visible to CuPy here; bench/gpu_check.sh is the GPU check")
@pytest.mark.parametrize("ranks", [2, 3])
def test_device_buffer_suite(ranks, tmp_path):
    run_suite(ranks, "tests/mpi/test_gpu.py", tmp_path, timeout=600)


#: hier's node layouts, "nodes x ranks per node": (ranks, ALLREDUCE_NODE_MAP or None for the ranks
#: that share memory, other settings, every dtype, or the smallest and the largest item size). Two with small segments
#: and slots, so that pieces move in many segments; about 35 s in all on 2 idle cores
SMALL_PIECES = {"ALLREDUCE_SEGMENT_BYTES": "4096", "ALLREDUCE_SHM_SLOT_BYTES": "4096"}
HIER_LAYOUTS = {
    "2x2": (4, "0,0,1,1", SMALL_PIECES, True),
    "3x2": (6, "0,0,1,1,2,2", {}, False),
    "2x3": (6, "0,0,0,1,1,1", {}, False),
    "1x3": (3, "0,0,0", {}, False),
    "1x3-shared-memory": (3, None, {}, False),
    "3x1": (3, "0,1,2", {}, False),
    "3+2": (5, "0,0,0,1,1", SMALL_PIECES, True),
    "1+2+1": (4, "0,1,1,2", {}, False),
    "interleaved-2x2": (4, "1,0,1,0", {}, False),
    "bamtree-2+1+2": (5, "0,0,1,2,2", {"ALLREDUCE_HIER_ACROSS": "bamtree"}, True),
}


@pytest.mark.parametrize("layout", HIER_LAYOUTS)
def test_hier_suite(layout, tmp_path):
    ranks, node_map, env, every_dtype = HIER_LAYOUTS[layout]
    env = {"ALLREDUCE_NODE_MAP": node_map or "", "ALLREDUCE_HIER_ACROSS": "ring", **env}  # "": shared memory
    run_suite(ranks, "tests/mpi/test_hier.py", tmp_path, timeout=180, env=env,
              select=None if every_dtype else SMALLEST_AND_LARGEST_ITEMS)
