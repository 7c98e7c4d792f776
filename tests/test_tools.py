"""The offline tools' text and pictures: compare and model fit 120 columns with whole names and
ratios to native MPI; plot's log y axis, size ticks and title; every flag's help states its default."""

import ast
import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

VENDOR = ROOT / "tests" / "data" / "nccl-tests" / "superbench_8xA100_allreduce.log"
MODELLED = ["ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot"]  # bench model's default --algo
ALGORITHMS = ["ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier", "oneshot", "twoshot", "mpi", "mpi4py"]
HELP_FILES = ["bench/tools/compare.py", "bench/tools/model.py", "bench/tools/plot.py", "bench/tools/scaling.py",
              "bench/tools/bound.py", "bench/tools/perf.py", "bench/tools/treebuild.py", "bench/lab/__main__.py",
              "bench/tools/gpu_check.py", "bench/tools/tune.py", "bench/tools/mpi_tuning.py",
              "bench/tools/nccl_tuning.py", "bench/train/tool.py", "bench/doctor/tool.py"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real 2-rank ``-J`` document of all 8 algorithms, 8 B to 32 KiB."""
    path = tmp_path_factory.mktemp("sweep") / "run.json"
    proc = run_mpi(2, ["-m", "bench", "-b", "8", "-e", "32K", "-f", "8", "-n", "3", "-w", "1", "--algo", "all",
                       "-J", str(path), "--log", "none"], timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return path


@pytest.fixture(scope="module")
def probe(sweep):
    """A real 2-rank probe file (``python -m topology probe``)."""
    path = sweep.parent / "topology.json"
    proc = run_mpi(2, ["-m", "topology", "probe", "-o", str(path), "-b", "1M"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return path


@pytest.fixture
def not_ours(tmp_path):
    """Another tool's JSON (the shape of ``python -m bench perf``'s), as a glob like results/*.json finds it."""
    path = tmp_path / "perf-cpu-4r.json"
    path.write_text(json.dumps({"benchmark": "perf-cpu", "ranks": 4, "rows": [{"bytes": 8, "ring_busbw": 0.001}]}))
    return path


def tool(*args):
    return subprocess.run([sys.executable, "-m", "bench", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def cells(text):
    """The table's rows (header first) split on runs of 2+ spaces; comments and blanks left out."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip() and line[0] != "#"]


def busbw(path, placement="out_of_place"):
    """{(algorithm, size): busbw} straight from a ``-J`` document."""
    return {(r["algorithm"], r["size"]): r[placement]["bus_bw"] for r in json.loads(path.read_text())["results"]}


def size_cell(size):
    """Sizes as the tables write them, computed here on their own: 8 B, 4 KiB, 32 KiB."""
    return f"{size >> 10} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def widest(text):
    return max(len(line) for line in text.splitlines())


# ---------------------------------------------------------------- compare

def test_compare_fits_120_columns_with_whole_names(sweep, tmp_path):
    tuned = tmp_path / "tuned.json"
    shutil.copy(sweep, tuned)  # the same algorithms in two files: labelled "bamtree (run)", "bamtree (tuned)"
    proc = tool("compare", VENDOR, sweep, tuned)
    assert proc.returncode == 0, proc.stderr
    assert widest(proc.stdout) <= 120, proc.stdout
    header, *rows = cells(proc.stdout)
    assert header == ["size", "algorithm", "busbw out-of-place (GB/s)", "time (us)", "vs superbench_8xA100_allreduce"]
    labels = {row[1] for row in rows}
    assert labels == {"superbench_8xA100_allreduce"} | {f"{a} ({f})" for a in ALGORITHMS for f in ("run", "tuned")}
    assert "8 GiB" in {row[0] for row in rows} and "4 KiB" in {row[0] for row in rows}


def test_compare_ratio_is_busbw_over_native_mpi(sweep):
    proc = tool("compare", sweep)
    assert proc.returncode == 0, proc.stderr
    assert widest(proc.stdout) <= 120
    header, *rows = cells(proc.stdout)
    assert header[-1] == "vs mpi"
    measured = busbw(sweep)
    sizes = sorted({size for _, size in measured})
    assert len(rows) == len(measured) == len(ALGORITHMS) * len(sizes)
    for size_text, algorithm, bw, _time, ratio in rows:
        size = next(s for s in sizes if size_cell(s) == size_text)
        expected = measured[(algorithm, size)] / measured[("mpi", size)]
        assert ratio.endswith("x") and float(ratio[:-1]) == pytest.approx(expected, rel=0.006), (size, algorithm)
        assert float(bw) == pytest.approx(measured[(algorithm, size)], rel=0.006)


def test_compare_reference_is_the_vendor_log_else_mpi_unless_named(sweep):
    vendor_busbw = {int(f[0]): float(f[6]) for f in (line.split() for line in VENDOR.read_text().splitlines())
                    if len(f) == 12 and f[0].isdigit()}
    proc = tool("compare", sweep, VENDOR)  # the vendor log is the reference wherever it stands
    header, *rows = cells(proc.stdout)
    assert header[-1] == "vs superbench_8xA100_allreduce"
    ring = next(row for row in rows if row[:2] == ["32 KiB", "ring"])
    assert float(ring[-1][:-1]) == pytest.approx(busbw(sweep)[("ring", 32768)] / vendor_busbw[32768], rel=0.006)
    assert vendor_busbw[8] == 0 and next(row for row in rows if row[:2] == ["8 B", "ring"])[-1] == "-"
    proc = tool("compare", VENDOR, sweep, "--reference", "ring", "--in-place")
    header, *rows = cells(proc.stdout)
    assert header[2:] == ["busbw in-place (GB/s)", "time (us)", "vs ring"]
    measured = busbw(sweep, "in_place")
    tree = next(row for row in rows if row[:2] == ["512 B", "tree"])
    assert float(tree[-1][:-1]) == pytest.approx(measured[("tree", 512)] / measured[("ring", 512)], rel=0.006)


def test_compare_skips_a_file_without_results(sweep, not_ours):
    proc = tool("compare", not_ours, sweep)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"python -m bench compare: skipped {not_ours}: no results of python -m bench "
                                        "(rows of a -J document or a JSON-lines log)"]
    assert {row[1] for row in cells(proc.stdout)[1:]} == set(ALGORITHMS)


def test_compare_fails_in_one_line_when_no_file_is_readable(not_ours, tmp_path):
    missing = tmp_path / "missing.log"
    proc = tool("compare", not_ours, missing)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m bench compare: nothing to compare: ")
    assert str(not_ours) in lines[0] and f"{missing}: cannot read: No such file or directory" in lines[0]


# ---------------------------------------------------------------- model

def test_model_fits_120_columns_and_compares_measured_with_mpi(sweep, probe):
    from algorithms.costs import cost_model
    from topology import BandwidthMatrix

    proc = tool("model", "--topology", probe, "-b", "8", "-e", "32K", "-f", "8", "--results", sweep)
    assert proc.returncode == 0, proc.stderr
    assert widest(proc.stdout) <= 120, proc.stdout
    header, *rows = cells(proc.stdout)
    assert header == ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound",
                      "measured us", "measured GB/s", "x bound", "vs mpi"]
    assert "bytes" not in proc.stdout and "1 levels" not in proc.stdout
    assert "# tree: 1 level, bottleneck (GB/s) " in proc.stdout  # 2 ranks: one level
    measured, model = busbw(sweep), cost_model(BandwidthMatrix.load(probe))
    sizes = [8, 64, 512, 4096, 32768]
    modelled = list(MODELLED) + ["mpi"]  # the model's algorithms (those the sweep ran too have measured cells)
    assert set(ALGORITHMS) - {"mpi4py"} <= set(modelled)  # mpi4py: measured, neither modelled nor the reference
    assert [row[0] for row in rows] == [size_cell(s) for s in sizes for _ in modelled]
    for row in rows:
        size = sizes[[size_cell(s) for s in sizes].index(row[0])]
        algorithm = row[1]
        if (algorithm, size) in measured:
            assert float(row[-1][:-1]) == pytest.approx(measured[(algorithm, size)] / measured[("mpi", size)],
                                                        rel=0.006)
        else:
            assert row[-4:] == ["-", "-", "-", "-"]
        if algorithm != "mpi":  # the model's own numbers, unchanged
            assert float(row[2]) == pytest.approx(model.time(algorithm, size) * 1e6, rel=0.006)
            assert float(row[3]) == pytest.approx(model.busbw(algorithm, size), rel=0.006)
            assert row[4] == str(model.limit(algorithm, size)) and row[4] in ("latency", "link", "port", "uplink")


def test_model_uniform_links_without_results():
    proc = tool("model", "--ranks", "8", "--alpha-us", "10", "--beta-GBps", "400", "-b", "1K", "-e", "1G", "-f", "1024")
    assert proc.returncode == 0, proc.stderr
    assert widest(proc.stdout) <= 120
    assert proc.stdout.startswith("# alpha-beta model of 8 ranks, uniform links, alpha 10 us, beta 400 GB/s\n")
    header, *rows = cells(proc.stdout)
    assert header == ["size", "algorithm", "model us", "model GB/s", "limited by", "x bound"]
    assert [row[0] for row in rows[::len(MODELLED)]] == ["1 KiB", "1 MiB", "1 GiB"]
    assert "# tree: 3 levels, bottlenecks (GB/s) 400.00, 400.00, 400.00" in proc.stdout
    assert re.search(r"# ring overtakes the binomial tree from \d+(\.\d)? [KMG]iB\n", proc.stdout), proc.stdout


# ---------------------------------------------------------------- text helpers

def test_numbers_sizes_and_plurals():
    from bench.formats.tables import plural, ratio_text, significant, size_label

    assert [ratio_text(r) for r in (0.012, 0.0166, 1.234, 12.34, 216.4)] == \
        ["0.0120x", "0.0166x", "1.23x", "12.3x", "216x"]
    assert [significant(v) for v in (0.000498, 0.0, 65.52, 63896.0)] == ["0.000498", "0", "65.5", "63896"]
    assert [size_label(n) for n in (8, 1024, 4 << 20, 1 << 30, 1536, 123457)] == \
        ["8 B", "1 KiB", "4 MiB", "1 GiB", "1.5 KiB", "120.6 KiB"]
    assert [plural(1, "rank"), plural(2, "rank"), plural(1, "level")] == ["1 rank", "2 ranks", "1 level"]


# ---------------------------------------------------------------- plot

def test_plot_x_tick_labels():
    from bench.tools.plot import size_tick, size_ticks

    assert [size_tick(n) for n in (8, 512, 1024, 1 << 20, 1 << 30, 3 << 20, 1000)] == \
        ["8", "512", "1K", "1M", "1G", "3M", "1000"]
    major, minor = size_ticks([8, 1 << 33])  # a vendor log's range: every other power of 2
    assert len(major) <= 16 and {1 << 10, 1 << 20, 1 << 30} <= set(major) and len(minor) == 31
    major, _ = size_ticks([1024, 65536])
    assert major == [1 << e for e in range(10, 17)]


def test_plot_log_y_axis_is_chosen_by_the_spread():
    from bench.tools.plot import wants_logy

    assert wants_logy([235.26, 1.1, 0.0005])  # a GPU log beside CPU curves
    assert not wants_logy([0.0, 0.1, 4.9])  # zeros do not count; 49x
    assert not wants_logy([1.0, 50.0]) and wants_logy([1.0, 50.1])
    assert not wants_logy([0.0, 0.0]) and not wants_logy([])


def test_plot_default_title():
    from bench.tools.plot import default_title

    ours = {"collective": "allreduce", "ranks": 2, "hosts": ["vm"], "mpi": "MPICH Version:      5.0.2"}
    assert default_title([ours, {"algorithm": "vendor"}]) == "all-reduce busbw, 2 ranks on vm, MPICH 5.0.2"
    assert default_title([ours], "in_place") == "all-reduce busbw, in place, 2 ranks on vm, MPICH 5.0.2"
    open_mpi = {"collective": "allreduce", "ranks": 16, "hosts": ["a", "b", "c", "d"],
                "mpi": "Open MPI v4.1.2, package: Open MPI builder Distribution, ident: 4.1.2"}
    assert default_title([open_mpi]) == "all-reduce busbw, 16 ranks on 4 hosts, Open MPI v4.1.2"
    assert default_title([{"algorithm": "vendor"}]) == "busbw against message size"


def test_plot_writes_pngs_with_a_log_axis_where_needed(sweep, not_ours, tmp_path):
    from bench.tools.plot import plot

    png = tmp_path / "vendor.png"
    proc = tool("plot", not_ours, VENDOR, sweep, "-o", png)  # GPU beside CPU: log y, by itself
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {png} (log y axis)\n"
    assert proc.stderr == f"python -m bench plot: skipped {not_ours}: no results of python -m bench " \
                          "(rows of a -J document or a JSON-lines log)\n"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
    proc = tool("plot", VENDOR, sweep, "-o", png, "--no-logy")
    assert proc.returncode == 0 and proc.stdout == f"wrote {png}\n"
    near = [{"algorithm": "ring", "size": 1024 << i, "out_of_place": {"bus_bw": 0.5 + i}} for i in range(5)]
    assert plot(near, tmp_path / "near.png") is False and (tmp_path / "near.png").stat().st_size > 10000  # 9x
    assert plot(near, tmp_path / "forced.png", logy=True) is True and (tmp_path / "forced.png").exists()


# ---------------------------------------------------------------- help texts

def arguments(path):
    """(flag, help text, default given) of every add_argument call in ``path``."""
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            keywords = {k.arg: k.value for k in node.keywords}
            text = ast.unparse(keywords["help"]) if "help" in keywords else None
            yield ast.literal_eval(node.args[0]), text, "default" in keywords


@pytest.mark.parametrize("path", HELP_FILES)
def test_every_flag_has_help_that_states_its_default(path):
    for flag, text, has_default in arguments(path):
        assert text, f"{path}: {flag} has no help"
        if flag.startswith("-") and (has_default or "required" not in text):
            assert "default" in text, f"{path}: {flag}'s help does not state its default: {text}"


HELP_COMMANDS = [["bench", "compare"], ["bench", "model"], ["bench", "plot"], ["bench", "scaling"],
                 ["bench", "bound"], ["bench.perf"], ["bench.treebuild"], ["bench.lab"], ["bench.lab", "up"],
                 ["bench.lab", "run"], ["bench.gpu_check"], ["bench", "tune"], ["bench", "mpi-tuning"],
                 ["bench", "nccl-tuning"], ["bench", "gpu-check"], ["bench", "train"], ["bench", "doctor"]]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_help_names_nothing_a_user_cannot_see(command):
    proc = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for phrase in ("seed 00", "the seed", "seed's", "issue", "DESIGN.md", "run U", "this machine", "/work/",
                   "shared/"):
        assert phrase not in text, f"{' '.join(command)} --help says {phrase!r}"
    description = text.split("\n\n")[1]
    assert description.rstrip().endswith((".", ")")), description  # a whole sentence


def _error_of(main, argv, capsys):
    """The one line a tool's ``main(argv)`` ends with on a bad argument (exit status 2)."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2, out + err
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_every_tool_resolves_algo_and_type_names_alike(capsys):
    """--algo and the type flags: an unknown name is refused by every tool with the same words
    (the set of names each tool declares after them), and every spelling the table of types
    knows of a type (nccl-tests', NumPy's, the aliases, bench train's) is taken where that type is."""
    from algorithms.dtypes import BY_NAME, TYPES
    from bench.core import options
    from bench.core.cli import Parser, Types, add_dtype_flag
    from bench.tools import model, plan, plan_fit, scaling, tune
    from bench.train import tool as train

    def sweep(argv):
        options.parse_args(argv)
    tools = {"the sweep": (sweep, "-d", "--algo"), "model": (model.main, None, "--algo"),
             "plan": (plan.main, "-d", "--algo"), "plan-fit": (plan_fit.main, None, "--algo"),
             "scaling": (scaling.main, "--dtype", "--algo"), "train": (train.main, "--dtype", "--algo"),
             "tune": (tune.main, "-d", "--algo")}
    needs = {"model": ["--ranks", "4"], "plan": ["-n", "4"], "scaling": ["--params", "1e6", "--compute-time", "1"]}
    for name, (main, type_flag, _) in tools.items():
        line = _error_of(main, [*needs.get(name, []), "--algo", "ring,warp"], capsys)
        assert re.search(r"unknown --algo warp( for allreduce| for a plan)?; choices: ps,ring,", line), (name, line)
        if type_flag:
            line = _error_of(main, [*needs.get(name, []), type_flag, "fp33"], capsys)
            assert re.search(r"argument (-d/--datatype|--dtype): unknown type fp33; choices: ", line), (name, line)
    for among in (TYPES, train.TRAINED):
        parser = Parser(prog="test")
        add_dtype_flag(parser, "float", "types", many=True, among=among)
        for spelling, row in BY_NAME.items():
            if row in among:
                assert parser.parse_args(["-d", spelling]).datatype == Types([row]), spelling
        assert parser.parse_args(["-d", "fp32,bf16,float32"]).datatype.rows == [BY_NAME["float32"], BY_NAME["bf16"]]
