"""The benchmark driver, run for real under mpiexec, read back the way nccl-tests parsers read it."""

import re
import subprocess
import sys

from conftest import ROOT, run_mpi


def parse_tables(text):
    """Split nccl-tests-style output into {algorithm: (rows, out_of_bounds_line)}, SuperBench's way:
    the numeric rows after the header that names size/time/algbw/busbw."""
    tables, algo, rows = {}, None, []
    for line in text.splitlines():
        m = re.match(r"# Algorithm: (\S+)", line)
        if m:
            algo, rows = m.group(1), []
        elif line.startswith("# Out of bounds values"):
            tables[algo] = (rows, line)
        elif algo and not line.startswith("#") and line.strip():
            fields = line.split()
            assert len(fields) == 13, line
            rows.append(fields)
    return tables


def test_sweep_of_every_algorithm_reports_zero_wrong():
    proc = run_mpi(3, ["-m", "bench", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
                       "-d", "int32", "-o", "all"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables = parse_tables(proc.stdout)
    assert set(tables) == {"ps", "ring", "tree", "mpi"}
    for algo, (rows, oob) in tables.items():
        assert oob == "# Out of bounds values : 0 OK", algo
        # 5 sizes (8 B, 64 B, 512 B, 4 KiB, 32 KiB) x 4 ops (avg is skipped for integers)
        assert len(rows) == 20, (algo, rows)
        for fields in rows:
            size, count = int(fields[0]), int(fields[1])
            assert size == 4 * count and fields[2] == "int32" and fields[4] == "-1"
            assert fields[8] == "0" and fields[12] == "0", fields  # #wrong, both placements
            assert float(fields[5]) > 0 and float(fields[9]) > 0  # times
    assert proc.stdout.count("Ranks: 3") == 4


def test_unknown_flag_is_refused():
    proc = subprocess.run([sys.executable, "-m", "bench", "--frobnicate"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unrecognized arguments: --frobnicate" in proc.stderr


def test_unknown_algorithm_is_refused():
    proc = subprocess.run([sys.executable, "-m", "bench", "--algo", "ring,butterfly"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown --algo butterfly; choices: ps,ring,tree,bamtree,kmtree,mpi,all" in proc.stderr


def test_matched_trees_need_a_topology():
    proc = subprocess.run([sys.executable, "-m", "bench", "--algo", "bamtree"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--algo bamtree builds its tree from link bandwidths: pass --topology FILE" in proc.stderr


def test_matched_trees_from_a_probe(tmp_path):
    """probe -> bandwidth file -> bench --topology runs bamtree and kmtree with zero wrong."""
    topo = tmp_path / "topo.json"
    proc = run_mpi(3, ["-m", "topology", "probe", "-o", str(topo), "-b", "64K", "--reps", "2"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = run_mpi(3, ["-m", "bench", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
                       "--algo", "bamtree,kmtree", "--topology", str(topo)], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables = parse_tables(proc.stdout)
    assert set(tables) == {"bamtree", "kmtree"}
    for rows, oob in tables.values():
        assert oob == "# Out of bounds values : 0 OK" and len(rows) == 3
