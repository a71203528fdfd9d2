"""The shell tools that run the kernels on a GPU machine (tools/*.sh), checked where CI runs: their
syntax, their argument errors, and ab_kernels.sh's alternation of builds with a stand-in interpreter."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tools").glob("*.sh"))


def _bash(*args, cwd=ROOT, env=None):
    return subprocess.run(["bash", *map(str, args)], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_tools_parse(script):
    result = _bash("-n", script)
    assert result.returncode == 0, result.stderr


def test_gpu_checklist_names_its_steps_on_a_bad_one():
    result = _bash(ROOT / "tools" / "gpu_checklist.sh", "no_such_step")
    assert result.returncode == 2
    assert "tests compile sanitize suites sweeps" in result.stderr


def _stand_ins(tmp_path, sanitizer_rc):
    """A bin folder with an nvidia-smi that names an H200, a compute-sanitizer that records its
    arguments and exits `sanitizer_rc` for racecheck, and an interpreter that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"nvidia-smi": 'echo "NVIDIA H200"',
               "compute-sanitizer": f'echo "sanitizer $*"; [[ "$*" == *racecheck* ]] && exit {sanitizer_rc}; exit 0',
               "python": 'echo "python $*"'}
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python")}


@pytest.mark.parametrize("racecheck_rc", [0, 1])
def test_gpu_checklist_runs_each_step_under_its_limit_and_reports_failures(tmp_path, racecheck_rc):
    out = tmp_path / "out"
    env = dict(_stand_ins(tmp_path, racecheck_rc), OUT=str(out), LIMIT_SANITIZE="30")
    result = _bash(ROOT / "tools" / "gpu_checklist.sh", "sanitize", env=env)
    assert result.returncode == racecheck_rc, result.stdout + result.stderr
    log = (out / "sanitize.log").read_text()
    assert "sanitizer --error-exitcode 1 --tool memcheck" in log and "sanitizer_workload.py sm90_gemm" in log
    assert "--tool racecheck" in log and "sanitizer_workload.py --quick" in log
    summary = (out / "summary.txt").read_text()
    assert "gpu: NVIDIA H200" in summary and f"overall: exit {racecheck_rc}" in summary
    assert summary.count("sanitize: exit 0") == 2 - racecheck_rc


def test_ab_kernels_needs_a_mode_and_two_builds():
    script = ROOT / "tools" / "ab_kernels.sh"
    assert _bash(script, "no_such_mode").returncode == 2
    result = _bash(script, "time", "--rows", "64", "only_one")
    assert result.returncode == 2 and "two or more builds" in result.stderr


@pytest.mark.skipif(shutil.which("xz") is None, reason="needs xz")
def test_ab_kernels_alternates_builds_and_configs_and_restores_the_checkout(tmp_path):
    # A checkout with the script, its own "build" and two stored ones; the interpreter is a stand-in
    # that records which build is in place and the arguments graph_calls.py got.
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "ab_kernels.sh", tmp_path / "tools")
    (tmp_path / "vga_linear").mkdir()
    (tmp_path / "vga_linear" / "_C.abi3.so").write_text("own\n")
    store = tmp_path / ".dev" / "abx"
    store.mkdir(parents=True)
    for name in ("a", "b"):
        (store / name).write_text(f"build {name}\n")
        subprocess.run(["xz", "-z", str(store / name)], check=True)
        (store / f"{name}.xz").rename(store / f"{name}.so.xz")
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/bash\nif [[ "$1" == *ab_compare.py ]]; then cat "$2"; exit 0; fi\n'
                        'echo "ran $(cat vga_linear/_C.abi3.so): ${*:2}"\n')
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    result = _bash(tmp_path / "tools" / "ab_kernels.sh", "time", "--layers", "32,128,4096", "--rows", "64,333",
                   "--rounds", "2", "a", "b:sm90_gemm/n112", env={"OUT": str(out), "PYTHON": str(stand_in)})
    assert result.returncode == 0, result.stderr
    runs = ["== a", "ran build a: --layers 32,128,4096 --rows 64,333",
            "== b:sm90_gemm/n112", "ran build b: --layers 32,128,4096 --rows 64,333 --config sm90_gemm/n112"]
    assert (out / "ab.txt").read_text().splitlines() == runs * 2
    assert (tmp_path / "vga_linear" / "_C.abi3.so").read_text() == "own\n"

    # A build whose run hangs costs AB_TIMEOUT, is recorded as such, and the others still run.
    stand_in.write_text('#!/bin/bash\nif [[ "$1" == *ab_compare.py ]]; then exit 0; fi\n'
                        'if grep -q "build a" vga_linear/_C.abi3.so; then sleep 30; fi; echo ran\n')
    (out / "ab.txt").unlink()
    result = _bash(tmp_path / "tools" / "ab_kernels.sh", "time", "--rows", "64", "--rounds", "1", "a", "b",
                   env={"OUT": str(out), "PYTHON": str(stand_in), "AB_TIMEOUT": "1"})
    assert result.returncode == 0, result.stderr
    assert (out / "ab.txt").read_text().splitlines() == ["== a", "(graph_calls.py exit 124)", "== b", "ran"]
    assert (tmp_path / "vga_linear" / "_C.abi3.so").read_text() == "own\n"
