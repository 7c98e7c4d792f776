"""The compiled engine is an optional part of the install: without a C compiler the package still
builds and installs, and the Python engine runs every plan, saying why in the benchmark's header."""

import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT, mpiexec


def test_an_install_without_a_c_compiler_runs_the_python_engine(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CC": "/bin/false", "LDSHARED": "/bin/false",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    source = tmp_path / "source"  # this tree's code and its build files, without what a build made here
    for package in ("plumbing", "algorithms", "topology", "bench"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "wheels"), str(source)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((tmp_path / "wheels").glob("allreduce_bench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "algorithms/runtime/compiled.py" in names and not [n for n in names if n.endswith(".so")], names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   env=env, check=True, timeout=300)
    env["PYTHONPATH"] = str(target)  # the installed wheel, with this tree's editable install out of the way
    python = [sys.executable, str(ROOT / "tests" / "scripts" / "without_this_tree.py")]
    run = subprocess.run([mpiexec(), "-n", "2", *python, "-m", "bench", "-b", "8", "-e", "1K", "-f", "8",
                          "-n", "5", "-w", "1", "--algo", "ring", "--log", "none"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    engine = next(line for line in run.stdout.splitlines() if line.startswith("# Engine:"))  # this tree's says compiled
    assert engine.startswith("# Engine: python (the compiled engine cannot run: the compiled engine was not built"), engine
    assert "# Out of bounds values : 0 OK" in run.stdout
