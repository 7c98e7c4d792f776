"""``python -m bench bound``: the compiled ring and tree probe, built and run for real."""

import json
import platform
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

SOURCE = ROOT / "bench" / "probes" / "ring_bound.c"
VARIANTS = {"copy", "copy_stream", "cma_plain", "cma_stream", "cma_push", "slots_stream", "shared_plain",
            "shared_fused", "tree_plain", "tree_stream"}

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe is x86-64 only"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (.ci/run installs gcc)"),
]


def bound(*args, tmp_path, env=None):
    return subprocess.run([sys.executable, "-m", "bench", "bound", *args, "-o", str(tmp_path / "bound")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_every_variant_sums_right_and_is_timed_against_the_copy(tmp_path):
    proc = bound("-b", "1M", "-e", "2M", "--piece", "16K", "--repeats", "3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "bound.json").read_text())
    assert [row["bytes"] for row in data["rows"]] == [1 << 20, 2 << 20]
    assert data["machine"]["commit"] and data["piece_bytes"] == 16 << 10 and data["repeats"] == 3
    for row in data["rows"]:
        assert set(row["variants"]) == VARIANTS
        # the reference against itself, repetition by repetition, is exactly 1
        assert row["variants"]["copy"]["vs_copy"] == {"median": 1.0, "min": 1.0, "max": 1.0}
        for v in row["variants"].values():
            ratio = v["vs_copy"]
            assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
            assert v["time_s"] > 0 and v["busbw_GBps"] == pytest.approx(row["bytes"] / v["time_s"] / 1e9)
        for tree in ("tree_plain", "tree_stream"):
            ratio = row["variants"][tree]["vs_ring"]
            assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
    text = (tmp_path / "bound.md").read_text()
    assert "| 1048576 |" in text and "| 2097152 |" in text and "`shared_fused`" in text
    assert "| bytes | tree_plain/cma_plain | tree_stream/cma_stream |" in text


@pytest.mark.parametrize("broken,instead,variant", [
    # the peer's half never arrives
    ("copy_stream(peer_sy + o, tmp, pn);", ";", "shared_fused"),
    ("if (v == CMA_PLAIN) cma(0, y + theirs, peer_y + theirs, half * 4);", "if (v == CMA_PLAIN) {}", "cma_plain"),
    # the last piece is left out
    ("for (long i = 0; (size_t)i * pn < half; i++)", "for (long i = 0; (size_t)(i + 1) * pn < half; i++)",
     "slots_stream"),
    # the tree's root adds its own input twice instead of the other rank's
    ("if (v == TREE_PLAIN) add(y + o, x + o, tmp, pn);", "if (v == TREE_PLAIN) add(y + o, x + o, x + o, pn);",
     "tree_plain"),
])
def test_the_probe_finds_a_wrong_sum(tmp_path, broken, instead, variant):
    """The probe's own check against the closed form fails when a variant skips part of its work."""
    text = SOURCE.read_text()
    assert text.count(broken) == 1
    source = tmp_path / "broken.c"
    source.write_text(text.replace(broken, instead))
    exe = tmp_path / "broken"
    subprocess.run(["cc", "-O2", "-march=native", "-o", str(exe), str(source)], check=True, timeout=120)
    proc = subprocess.run([str(exe), str(1 << 20), str(16 << 10), "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"{variant}: wrong sum" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["-b", "1M", "-e", "1M", "--piece", "100"], "--piece 100 must be a multiple of 64 bytes"),
    (["-b", "1M", "-e", "1M", "--piece", "1M"], "it does not for [1048576]"),
    (["-b", "1M", "-e", "1M", "--repeats", "0"], "--repeats must be 1..101"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_give_a_clear_error_and_write_nothing(tmp_path, args, message):
    proc = bound(*args, tmp_path=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_missing_compiler_says_so(tmp_path):
    proc = bound("-b", "1M", "-e", "1M", tmp_path=tmp_path, env={"PATH": "/usr/bin:/bin", "CC": "no-such-cc"})
    assert proc.returncode == 1
    assert "no C compiler: 'no-such-cc' is not on PATH" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())
