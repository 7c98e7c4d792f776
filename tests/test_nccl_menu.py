"""NCCL's own algorithms and protocols (``--algo nccl:ALGO/PROTO``) and the tuner-plugin file
``bench nccl-tuning`` writes.

No GPU here: the file is built from nccl-tests logs (the format of a real 8xA100 log, with the
lines NCCL prints when NCCL_ALGO, NCCL_PROTO and NCCL_DEBUG=INFO are set, and each pair's times
drawn from a closed form) and from rows of our -J format; it is read back by a reader written
here from the example plugin's documented rules (first line that matches and whose pair NCCL
allows), and, where ``NCCL_TUNER_EXAMPLE_PLUGIN`` names a build of NCCL's example plugin, by
that plugin itself."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_mpi

from bench.baselines.nccl import environment_for
from bench.tools.nccl_tuning import LARGEST, plugin_choice

VENDOR_LOG = ROOT / "tests" / "data" / "nccl-tests" / "superbench_8xA100_allreduce.log"
PLUGIN = os.environ.get("NCCL_TUNER_EXAMPLE_PLUGIN")

# each pair's out-of-place time from the real log's time t at size s: who wins changes with size
PAIRS = {("ring", "ll"): lambda s, t: t * 0.8 * (1 + s / 2 ** 14),
         ("ring", "simple"): lambda s, t: t * 1.3,
         ("tree", "ll128"): lambda s, t: t * (1.5 if s > 2 ** 24 else 0.9)}
NCCL_NAMES = {"ring": "Ring", "tree": "Tree", "ll": "LL", "ll128": "LL128", "simple": "Simple"}


def vendor_rows():
    """(size, out-of-place us) of the real log, sizes above 0."""
    rows = []
    for line in VENDOR_LOG.read_text().splitlines():
        fields = line.split()
        if not line.startswith("#") and len(fields) >= 12 and fields[0].isdigit() and int(fields[0]) > 0:
            rows.append((int(fields[0]), float(fields[4])))
    return rows


def write_logs(folder, algo_line=None):
    paths = []
    lines = VENDOR_LOG.read_text().splitlines()
    for (algorithm, protocol), time in PAIRS.items():
        out = [f"host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to {algo_line or NCCL_NAMES[algorithm]}",
               f"host:1:1 [0] NCCL INFO NCCL_PROTO set by environment to {NCCL_NAMES[protocol]}",
               "host:1:1 [0] NCCL INFO 24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels"]
        for line in lines:
            fields = line.split()
            if not line.startswith("#") and len(fields) >= 12 and fields[0].isdigit():
                line = line.replace(fields[4], f"{time(int(fields[0]), float(fields[4])):.2f}", 1)
            out.append(line)
        path = folder / f"{algorithm}-{protocol}.log"
        path.write_text("\n".join(out) + "\n")
        paths.append(str(path))
    return paths


def tuning(*args):
    return subprocess.run([sys.executable, "-m", "bench", "nccl-tuning", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def read_tuner_file(path):
    """The example plugin's reading of its file: lines of 8-10 comma-separated fields, '#' comments."""
    configs = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        assert len(line) <= 255 and " " not in line, line
        fields = line.split(",")
        assert 8 <= len(fields) <= 10, line
        configs.append((fields[0], int(fields[1]), int(fields[2]), fields[3], fields[4], *map(int, fields[5:8])))
    return configs


def plugin_pick(configs, collective, nbytes, nodes, ranks, allowed=None):
    """The first line that matches a call and whose pair is allowed: (algorithm, protocol, channels)."""
    for coll, lo, hi, algorithm, protocol, channels, n_nodes, n_ranks in configs:
        if (coll == collective and lo <= nbytes <= hi and n_nodes in (-1, nodes) and n_ranks in (-1, ranks)
                and (allowed is None or (algorithm, protocol) in allowed)):
            return algorithm, protocol, channels
    return None


def fastest(rows, allowed=PAIRS):
    """Brute force from the closed forms: per size, the allowed pair of least time."""
    return {s: min(allowed, key=lambda pair: round(PAIRS[pair](s, t), 2)) for s, t in rows}


def test_each_pair_sets_nccl_algo_and_proto_and_one_per_run():
    assert environment_for(["--algo", "nccl:ring/ll128"], {}) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}
    assert environment_for(["--algo=ring,nccl:nvls_tree/simple"], {}) == {"NCCL_ALGO": "NVLSTree", "NCCL_PROTO": "Simple"}
    assert environment_for(["--algo", "ring,nccl"], {}) == {}
    assert "one nccl:ALGO/PROTO per run" in environment_for(["--algo", "nccl:ring/ll,nccl:tree/ll"], {})
    assert "unknown NCCL algorithm/protocol nccl:ring" in environment_for(["--algo", "nccl:ring"], {})
    clash = environment_for(["--algo", "nccl:ring/ll"], {"NCCL_ALGO": "Tree"})
    assert "but NCCL_ALGO=Tree is set" in clash


def test_the_sweep_refuses_nccl_pairs_it_cannot_run_with_one_line():
    for algo, says in (("nccl:ring/ll", "--algo nccl:ring/ll needs --device gpu"),
                       ("nccl:ring/ll,nccl:tree/simple", "one nccl:ALGO/PROTO per run"),
                       ("nccl,nccl:ring/ll", "one nccl:ALGO/PROTO per run, alone among the NCCL runs"),
                       ("nccl:ring/fast", "unknown NCCL algorithm/protocol nccl:ring/fast")):
        proc = run_mpi(1, ["-m", "bench", "-b", "8", "-e", "8", "--algo", algo], timeout=60)
        assert proc.returncode == 2, (algo, proc.stdout, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr, (algo, proc.stderr)


def test_nccl_tests_logs_make_a_tuner_file_with_the_fastest_pair_at_each_size(tmp_path):
    out = tmp_path / "tuner.csv"
    proc = tuning(*write_logs(tmp_path), "-o", out)
    assert proc.returncode == 0, proc.stderr
    configs = read_tuner_file(out)
    rows = vendor_rows()
    best = fastest(rows)
    assert len(set(best.values())) == 3  # every pair wins somewhere, or the check would prove little
    for size, pair in best.items():
        assert plugin_pick(configs, "allreduce", size, 1, 8) == (*pair, 24), size  # 1 host, 8 ranks, 24 channels
    # a pair NCCL rules out falls through to the next fastest
    for size, _ in rows:
        allowed = set(PAIRS) - {best[size]}
        assert plugin_pick(configs, "allreduce", size, 1, 8, allowed)[:2] == fastest([(size, dict(rows)[size])], allowed)[size]
    # the ranges cover every byte count once per pair, from 0 to 2^64 - 1, and nothing for other shapes
    spans = sorted({(lo, hi) for _, lo, hi, *_ in configs})
    assert spans[0][0] == 0 and spans[-1][1] == LARGEST
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))
    assert all(sum(1 for c in configs if c[1:3] == span) == len(PAIRS) for span in spans)
    assert plugin_pick(configs, "allreduce", 1024, 2, 16) is None and plugin_pick(configs, "allgather", 1024, 1, 8) is None
    assert "tree/ll128" in proc.stdout and f"wrote {out}" in proc.stdout


def test_our_runs_make_a_tuner_file_and_the_channel_count_is_asked_for(tmp_path):
    sizes = [1 << k for k in range(3, 28, 4)]
    log = tmp_path / "runs.jsonl"
    with open(log, "w") as f:
        for (algorithm, protocol), time in PAIRS.items():
            for size in sizes:
                f.write(json.dumps({"algorithm": f"nccl:{algorithm}/{protocol}", "collective": "reducescatter",
                                    "size": size, "ranks": 16, "hosts": ["node1", "node2"],
                                    "out_of_place": {"time": time(size, 10 + size / 1e4)}}) + "\n")
    out = tmp_path / "tuner.csv"
    missing = tuning(log, "-o", out)
    assert missing.returncode == 2 and "give --channels N" in missing.stderr and not out.exists()
    proc = tuning(log, "-o", out, "--channels", "8")
    assert proc.returncode == 0, proc.stderr
    configs = read_tuner_file(out)
    for size in sizes:
        pair = min(PAIRS, key=lambda p: PAIRS[p](size, 10 + size / 1e4))
        assert plugin_pick(configs, "reducescatter", size, 2, 16) == (*pair, 8), size


def test_runs_that_cannot_make_a_file_fail_with_one_line(tmp_path):
    plain = tmp_path / "plain.log"
    plain.write_text(VENDOR_LOG.read_text())
    proc = tuning(plain, "-o", tmp_path / "t.csv")
    assert proc.returncode == 2 and "no 'NCCL_ALGO set by environment to' line" in proc.stderr
    proc = tuning(*write_logs(tmp_path, algo_line="ring,tree"), "-o", tmp_path / "t.csv")
    assert proc.returncode == 2 and "NCCL_ALGO=ring,tree leaves NCCL a choice" in proc.stderr
    for bad in ("0", "-2"):
        proc = tuning(*write_logs(tmp_path), "-o", tmp_path / "t.csv", "--channels", bad)
        assert proc.returncode == 2 and "--channels must be positive, or -1" in proc.stderr
    assert not (tmp_path / "t.csv").exists()
    assert all("Traceback" not in p.stderr for p in [proc])


@pytest.mark.skipif(not PLUGIN, reason="NCCL_TUNER_EXAMPLE_PLUGIN (a build of NCCL's plugins/tuner/example) not set")
def test_nccls_example_plugin_follows_the_file(tmp_path):
    out = tmp_path / "tuner.csv"
    proc = tuning(*write_logs(tmp_path), "-o", out, "--plugin", PLUGIN)
    assert proc.returncode == 0, proc.stderr
    assert "picks the measured fastest pair at all" in proc.stdout
    rows = vendor_rows()
    best = fastest(rows)
    answers = plugin_choice(PLUGIN, str(out), [("allreduce", s) for s, _ in rows], 8, 1)
    assert answers == [(*best[s], 24) for s, _ in rows]
    allowed = set(PAIRS) - {("tree", "ll128")}
    answers = plugin_choice(PLUGIN, str(out), [("allreduce", s) for s, _ in rows], 8, 1, allowed=allowed)
    assert [a[:2] for a in answers] == [fastest([(s, t)], allowed)[s] for s, t in rows]
    assert plugin_choice(PLUGIN, str(out), [("allreduce", 1024)], 16, 2) == [None]  # another shape: no line
