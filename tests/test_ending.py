"""Single-process tests of what keeps a job whole: the settings' rules, the results writer,
the driver's fill and memory arithmetic, the error line, the topology file's rules."""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from algorithms import settings
from bench.core.check import check_expected, check_fill
from bench.core.memory import bytes_needed, check_memory
from bench.formats.results import ResultsWriter, read_results
from plumbing import ending
from topology import BandwidthMatrix


@pytest.mark.parametrize("name,raw,message", [
    ("ALLREDUCE_SEGMENT_BYTES", "4095", "ALLREDUCE_SEGMENT_BYTES='4095' is below its lower bound, 4 KiB"),
    ("ALLREDUCE_SEGMENT_BYTES", "-5", "must be a positive number of bytes"),
    ("ALLREDUCE_SEGMENT_BYTES", "2M", "ALLREDUCE_SEGMENT_BYTES='2M' must be a positive number of bytes"),
    ("ALLREDUCE_STAGE_BYTES", "1023", "below its lower bound, 1 KiB"),
    ("ALLREDUCE_SHM_SLOT_BYTES", "192", "below its lower bound, 256 B"),
    ("ALLREDUCE_SHM_SLOT_BYTES", str(128 << 20), "above its upper bound, 64 MiB"),
    ("ALLREDUCE_SHM_SLOT_BYTES", "1000", "ALLREDUCE_SHM_SLOT_BYTES=1000 must be a multiple of 64"),
    ("ALLREDUCE_SHM_BY_PAGES", "yes", "ALLREDUCE_SHM_BY_PAGES='yes' is not one of auto, 0, 1"),
    ("ALLREDUCE_CUDA_AWARE", "true", "ALLREDUCE_CUDA_AWARE='true' is not one of detect, 0, 1"),
])
def test_settings_are_refused_by_their_rules(monkeypatch, name, raw, message):
    monkeypatch.setattr(settings, "_READ_AT_IMPORT", {})  # as if nothing had been read at import
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=message):
        settings.setting(name)
    with pytest.raises(ValueError, match=r"\(on rank 0\)$"):
        settings.agree_settings(MPI.COMM_SELF)


def test_settings_take_their_bounds_and_defaults(monkeypatch):
    for name, rule in settings.WIRE.items():
        monkeypatch.delenv(name, raising=False)
        assert settings.setting(name) == rule.default
    monkeypatch.setenv("ALLREDUCE_SHM_SLOT_BYTES", "256")
    monkeypatch.setenv("ALLREDUCE_TRANSPORT", " Direct ")
    assert settings.setting("ALLREDUCE_SHM_SLOT_BYTES") == 256
    assert settings.setting("ALLREDUCE_TRANSPORT") == "direct"
    settings.agree_settings(MPI.COMM_SELF)


def test_a_value_read_at_import_falls_back_and_the_agreement_still_refuses_it(monkeypatch):
    monkeypatch.setenv("ALLREDUCE_SEGMENT_BYTES", "1")
    monkeypatch.setattr(settings, "_READ_AT_IMPORT", {})
    assert settings.setting_at_import("ALLREDUCE_SEGMENT_BYTES") == 2 << 20
    monkeypatch.setenv("ALLREDUCE_SEGMENT_BYTES", "65536")  # changed after import: the read text counts
    with pytest.raises(ValueError, match="ALLREDUCE_SEGMENT_BYTES='1' is below its lower bound"):
        settings.agree_settings(MPI.COMM_SELF)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "uint64", "float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_the_check_fill_is_its_closed_form(dtype, op):
    """bench.core.check builds its vectors by doubling copies; the closed forms by np.arange here."""
    if op == "avg" and np.dtype(dtype).kind != "f":
        return
    for count in (0, 1, 2, 7, 100, 1001):
        for size in (1, 3, 8):
            i = np.arange(count)
            for rank in range(size):
                expected = {"sum": rank % 4 + i % 3, "avg": rank % 4 + i % 3, "prod": np.where(i % size == rank, 2, 1),
                            "max": (rank % 16) * 3 + i % 7, "min": (rank % 16) * 3 + i % 7}[op].astype(dtype)
                assert np.array_equal(check_fill(dtype, op, count, rank, size), expected)
            inputs = np.array([check_fill("float64", op, count, r, size) for r in range(size)])
            reduced = {"sum": inputs.sum(0), "avg": inputs.sum(0) / size, "prod": inputs.prod(0),
                       "max": inputs.max(0), "min": inputs.min(0)}[op] if count else np.zeros(0)
            want = reduced.astype(dtype) if op != "avg" else (inputs.sum(0).astype(dtype) / size).astype(dtype)
            got = check_expected(dtype, op, count, size)
            assert got.dtype == np.dtype(dtype) and np.array_equal(got, want), (count, size)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_low_precision_check_sums_stay_exact_in_any_order(dtype, op):
    """Every partial sum of the fill is an integer the type holds, so any order of reduction
    gives the float64 sum, which the expected vector is (avg: that sum's quotient by N rounded
    once to the type, which the algorithms' division gives too: float8_e5m2 holds no 9, so a
    division by N in the type itself would divide by 8 at 9 ranks)."""
    import ml_dtypes

    from algorithms.ops import divider

    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    holds = 2 ** (ml_dtypes.finfo(dt).nmant + 1)  # every integer up to this is exact
    rng = np.random.default_rng(1)
    for size in (1, 2, 3, 5, 8, 9, 17, 40, 300):
        inputs = np.array([check_fill(dt, op, 50, r, size).astype(np.float64) for r in range(size)])
        assert inputs.min() >= 0 and inputs.sum(0).max() <= holds, size  # so all partial sums are exact
        assert inputs.sum(0).std() > 0 or size == 1, size  # elements differ, so a misplaced piece shows
        order = rng.permutation(size)  # a random order, in the type's own arithmetic
        acc = inputs[order[0]].astype(dt)
        for r in order[1:]:
            acc = np.add(acc, inputs[r].astype(dt))
        want = inputs.sum(0).astype(dt)
        if op == "avg":
            divider(np)(acc, size, acc)
            want = (inputs.sum(0) / size).astype(dt)
        got = check_expected(dt, op, 50, size)
        assert got.dtype == dt and np.array_equal(got.view(np.uint8), want.view(np.uint8)), size
        assert np.array_equal(acc.view(np.uint8), got.view(np.uint8)), size


def test_avg_counts_a_result_one_unit_in_the_last_place_off_as_right():
    import ml_dtypes

    from bench.core.check import wrong_elements

    expected = np.array([1.0, 3.0, 0.333984375, 0.0], dtype=ml_dtypes.bfloat16)
    one_ulp = np.array([1.0078125, 3.0, 0.3359375, 0.0], dtype=ml_dtypes.bfloat16)
    two_ulps = np.array([1.015625, 3.0, 0.333984375, 0.0], dtype=ml_dtypes.bfloat16)
    assert wrong_elements(one_ulp, expected, "avg") == 0
    assert wrong_elements(two_ulps, expected, "avg") == 1
    assert wrong_elements(one_ulp, expected, "sum") == 2  # every other op: bit for bit


def test_memory_needs_and_the_refusal():
    assert bytes_needed(1 << 30) == 7 * (1 << 30) + (128 << 20)
    assert bytes_needed(1 << 30, registered=True) == 12 * (1 << 30) + (128 << 20)
    check_memory(MPI.COMM_SELF, 1 << 20, "a small size")
    with pytest.raises(ValueError, match=r"^a huge size needs 1024\.0 GiB on \S+: 1 ranks x 1024\.0 GiB each, but "):
        check_memory(MPI.COMM_SELF, 1 << 40, "a huge size")


def writer(tmp_path, log="log.jsonl", document="run.json"):
    return ResultsWriter(document and str(tmp_path / document), log and str(tmp_path / log), ["x"], {},
                         {"ranks": 1})


ROW = {"algorithm": "ring", "size": 8, "type": "float", "redop": "sum", "out_of_place": {"bus_bw": 1.0, "nwrong": 0.0},
       "in_place": {"bus_bw": 3.0, "nwrong": 0.0}}


def test_the_document_is_written_at_once_and_after_every_row(tmp_path):
    w = writer(tmp_path)
    document = json.loads((tmp_path / "run.json").read_text())
    assert document["results"] == [] and document["allreduce_bench"]["complete"] is False
    w.add(ROW)
    w.add({**ROW, "size": 16, "in_place": {"bus_bw": 5.0, "nwrong": 2.0}})
    document = json.loads((tmp_path / "run.json").read_text())
    assert [r["size"] for r in document["results"]] == [8, 16]
    assert document["out_of_bounds"] == {"count": 2, "okay": "false"}
    assert document["average_bus_bandwidth"]["bandwidth"] == 2.5
    assert document["summaries"] == {"ring": {"out_of_bounds": 2, "average_bus_bandwidth": 2.5}}
    w.finish()
    assert json.loads((tmp_path / "run.json").read_text())["allreduce_bench"]["complete"] is True
    assert [json.loads(line)["size"] for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [8, 16]
    assert sorted(os.listdir(tmp_path)) == ["log.jsonl", "run.json"]  # no temporary file left


def test_paths_that_cannot_be_written_are_named(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="^--log .*f/x: cannot write there: part of its folder is a file$"):
        writer(tmp_path, log="f/x")
    with pytest.raises(ValueError, match="^-J .*f/x: cannot write there: part of its folder is a file$"):
        writer(tmp_path, document="f/x")
    with pytest.raises(ValueError, match="^-J and --log both name"):
        writer(tmp_path, log="same", document="same")


def test_a_cut_log_gets_a_fresh_line_and_readers_skip_the_fragment(tmp_path):
    (tmp_path / "log.jsonl").write_text(json.dumps(ROW) + '\n{"algor')
    w = writer(tmp_path, document=None)
    w.add({**ROW, "size": 32})
    w.finish()
    assert (tmp_path / "log.jsonl").read_text().splitlines()[1:] == ['{"algor', json.dumps({"ranks": 1, "start_time":
                                                                          w.document["start_time"], **ROW, "size": 32})]
    assert [r["size"] for r in read_results(tmp_path / "log.jsonl")] == [8, 32]


def test_the_error_line_names_the_exception_and_where_in_this_project():
    try:
        BandwidthMatrix.load("/nonexistent/topo.json")
    except ValueError as exc:
        line = ending.describe_exception(exc)
    assert line.startswith("ValueError: cannot read bandwidth matrix /nonexistent/topo.json: No such file")
    assert line.endswith(")") and "(topology/matrix.py:" in line


@pytest.mark.parametrize("data,message", [
    ([1, 2], "the file holds a list, not an object with a 'bandwidth_GBps' matrix"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "format": "other"}, "'format' is 'other'"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "version": True}, "'version' is True; this reader knows versions 1 and 2"),
    ({"bandwidth_GBps": [[0, 1], [1]]}, "row 1 has 1 entries for 2 rows"),
    ({"bandwidth_GBps": [[0, None], [1, 0]]}, r"bandwidth_GBps\[0\]\[1\] is null None, not a number"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "latency_us": [[0, 1e8], [1, 0]]},
     r"latency_us\[0\]\[1\] is 1e\+08, above the largest plausible latency, 1e\+07 us"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "hosts": ["a", 3]}, "'hosts' must be a list of host names; it holds an integer 3"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "measured": []}, "'measured' is a list, not an object"),
    ({"bandwidth_GBps": []}, "a square matrix with a row per rank"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "version": 3}, "'version' is 3; this reader knows versions 1 and 2"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "nodes": [0]}, "'nodes' has 1 entries for 2 ranks"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "nodes": [0, 2]}, "'nodes' numbers them 0..2 but never uses 1"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "nodes": [True, 0]}, r"'nodes'\[0\] is a boolean True, not a number from 0"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "nodes": "01"}, "'nodes' is a string, not a list with a number per rank"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "ports_GBps": {"egress": [1, 1]}},
     "'ports_GBps' must be an object with the lists 'egress' and 'ingress'"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "nodes": [0, 0], "ports_GBps": {"egress": [1, 2], "ingress": [1, 2]}},
     r"'ports_GBps'\['egress'\] has 2 entries for 1 node"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "ports_GBps": {"egress": [1, 1], "ingress": [0, 1]}},
     r"'ports_GBps'\['ingress'\]\[0\] is 0, not a bandwidth in \(0, 100000\] GB/s"),
    ({"bandwidth_GBps": [[0, 1], [1, 0]], "ports_GBps": {"egress": [1, "2"], "ingress": [1, 1]}},
     r"'ports_GBps'\['egress'\]\[1\] is a string '2', not a number"),
])
def test_topology_entries_are_checked_one_by_one(data, message):
    with pytest.raises(ValueError, match=message):
        BandwidthMatrix.from_json(data)


def test_arrays_in_code_meet_the_same_rules():
    with pytest.raises(ValueError, match="must hold numbers, not bool values"):
        BandwidthMatrix(np.ones((2, 2), dtype=bool))
    with pytest.raises(ValueError, match=r"bandwidth_GBps\[1\]\[0\] is 1e\+06, above the largest plausible"):
        BandwidthMatrix(np.array([[0.0, 1.0], [1e6, 0.0]]))
    assert BandwidthMatrix(np.array([[7, 1], [2, 7]])).bandwidth.tolist() == [[0.0, 1.0], [2.0, 0.0]]


@pytest.mark.parametrize("argv,level", [
    ([], "single"), (["--overlap", "off"], "single"), (["--overlap", "on"], "serialized"),
    (["--algo", "ring", "--overlap=off,on"], "serialized"), (["--ov", " on "], "serialized"),
    (["--overlap", "on", "--overlap", "off"], "single"), (["--overlap"], "single"), (["-J", "on"], "single"),
])
def test_train_asks_for_serialized_exactly_when_its_parser_reads_overlap_on(argv, level):
    """bench/tools decides before MPI starts what train's own parser reads later."""
    from bench.tools import TOOLS
    from bench.train.tool import comma_list, parser

    assert TOOLS["train"].thread_level(argv) == level
    assert all(tool.thread_level(argv) == "single" for name, tool in TOOLS.items() if name != "train")
    try:
        read = parser().parse_args(argv).overlap
    except SystemExit:
        return
    assert level == ("serialized" if "on" in comma_list(read) else "single")


def test_thread_levels_have_their_mpi_names():
    assert ending.thread_level_name() == ending.thread_level_name(MPI.Query_thread()) and \
        ending.thread_level_name().startswith("MPI_THREAD_")
    assert [ending.thread_level_name(getattr(MPI, f"THREAD_{n}")) for n in ("SINGLE", "SERIALIZED")] == [
        "MPI_THREAD_SINGLE", "MPI_THREAD_SERIALIZED"]
