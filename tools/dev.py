#!/usr/bin/env python3
"""Set up everything from a fresh clone, then run the main job or the tests.

    python3 tools/dev.py bench [bench.py args]    # set up, then python benchmarks/bench.py
    python3 tools/dev.py test  [pytest args]      # set up, then python -m pytest -q tests
    python3 tools/dev.py setup                    # set up only
    python3 tools/dev.py which                    # print the environment's python (sets up nothing)

Needs only Python >= 3.10 (and, for the CUDA kernels, a CUDA toolkit; setup.py finds it).
Setting up: use the active virtual environment, else make ./.venv (with the system's site
packages, so a torch already installed there is used rather than replaced); install torch
when none >= 2.10 is importable; install the build tools and the test/bench extras that
are missing; build the package in place (`pip install --no-build-isolation -e .`, so the
repo root imports the built kernels), skipped when vga_linear/_build_info.py says the
sources have not changed since the last CUDA build. The job runs from the repo root.
"""

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the build needs beyond torch, and the extras; keep in step with pyproject.toml.
BUILD_REQUIRES = {"setuptools": "setuptools>=77", "wheel": "wheel", "ninja": "ninja"}
EXTRAS = {"pytest": "pytest>=8", "hypothesis": "hypothesis>=6.100", "numpy": "numpy",
          "matplotlib": "matplotlib"}
# What each job cannot run without (matplotlib only draws bench.py --plot; its test skips).
NEEDS = {"test": ("pytest", "hypothesis", "numpy"), "bench": ("numpy",), "setup": ()}
MIN_TORCH = (2, 10)


def say(msg):
    print(f"[dev] {msg}", flush=True)


def build_inputs_hash():
    """The hash setup.py writes to vga_linear/_build_info.py as BUILD_INPUTS (same recipe)."""
    h = hashlib.sha256()
    for p in sorted([*(ROOT / "csrc").rglob("*"), ROOT / "setup.py", ROOT / "pyproject.toml"]):
        if p.is_file():
            h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def environment_python(create=True):
    """The interpreter to set up: the active venv/conda env's, else ./.venv's (made if missing)."""
    if sys.prefix != sys.base_prefix or os.environ.get("CONDA_PREFIX"):
        return sys.executable
    env = ROOT / ".venv"
    python = env / "bin" / "python"
    if not python.exists() and create:
        say(f"creating {env} (python {sys.version.split()[0]}, with system site packages)")
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env)
    return str(python)


def run(python, *args, **kw):
    return subprocess.run([python, *args], cwd=ROOT, **kw)


def probe(python, code):
    """stdout of `python -c code`, run outside the repo (so the source tree is not on sys.path)."""
    r = subprocess.run([python, "-c", code], cwd="/", capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def pip(python, *args):
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", *args]
    say("$ " + " ".join(cmd[1:]))
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        sys.exit(f"[dev] pip failed: {' '.join(args)}")


def missing(python, modules):
    code = ("import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))"
            % (list(modules),))
    out = probe(python, code)
    return list(modules) if out is None else out.split()


def ensure_torch(python):
    version = probe(python, "import torch; print(torch.__version__)")
    if version is not None:
        parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
        if parts >= MIN_TORCH:
            say(f"torch {version} (already installed: used as is)")
            return
        say(f"torch {version} is older than 2.10")
    pip(python, "torch>=2.10")


def build_is_current():
    """True when the in-place build of the current sources is there (a CUDA build: a
    pure-Python one is redone, since torch or the toolkit may have appeared since)."""
    info = ROOT / "vga_linear" / "_build_info.py"
    if not info.exists():
        return False
    fields = {}
    exec(info.read_text(), fields)  # noqa: S102  (our own generated file)
    built_so = list((ROOT / "vga_linear").glob("_C*.so"))
    return bool(fields.get("EXTENSION_BUILT") and built_so
                and fields.get("BUILD_INPUTS") == build_inputs_hash())


def build(python):
    log = ROOT / "build" / "dev-build.log"
    log.parent.mkdir(exist_ok=True)
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", "-v",
           "--no-build-isolation", "-e", ".[test,bench]"]
    say(f"building in place: {' '.join(cmd[1:])} (log: {log.relative_to(ROOT)})")
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    lines = log.read_text(errors="replace").splitlines()
    for line in dict.fromkeys(l.strip() for l in lines if l.lstrip().startswith("vga-linear:")):
        say(line)  # setup.py runs twice under pip (requirements, then the build): once each
    if rc != 0:
        print("\n".join(lines[-40:]), file=sys.stderr)
        sys.exit(f"[dev] the build failed (exit {rc}); the whole log is {log}")


def make_importable(python):
    """The tree was built earlier (e.g. on another machine): point this env at it with a .pth."""
    if probe(python, "import vga_linear, os; print(os.path.dirname(vga_linear.__file__))") == str(
            ROOT / "vga_linear"):
        return
    site = probe(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    Path(site, "vga_linear_dev.pth").write_text(str(ROOT) + "\n")
    say(f"{site}/vga_linear_dev.pth -> {ROOT}")


def setup(job):
    if sys.version_info < (3, 10):
        sys.exit(f"[dev] vga-linear needs Python >= 3.10, this is {sys.version.split()[0]}")
    python = environment_python()
    say(f"environment: {python}")
    ensure_torch(python)
    if build_is_current():
        say("the in-place CUDA build is current (vga_linear/_build_info.py): not rebuilding")
        need = missing(python, NEEDS[job])
        if need:
            pip(python, *(EXTRAS[m] for m in need))
        make_importable(python)
    else:
        need_build = missing(python, BUILD_REQUIRES)
        major = probe(python, "import setuptools; print(setuptools.__version__.split('.')[0])")
        if "setuptools" not in need_build and (major is None or int(major) < 77):
            need_build.append("setuptools")  # the SPDX `license` field needs setuptools >= 77
        if need_build:
            pip(python, *(BUILD_REQUIRES[m] for m in need_build))
        build(python)
    status = probe(python, "import vga_linear as v; print(v.kernels_loaded(), v.kernels_not_loaded_reason())")
    say(f"vga_linear kernels loaded: {status}")
    return python


def main(argv):
    if not argv or argv[0] not in ("bench", "test", "setup", "which"):
        sys.exit(__doc__)
    job, rest = argv[0], argv[1:]
    if job == "which":
        print(environment_python(create=False))
        return 0
    python = setup(job)
    if job == "setup":
        return 0
    if job == "bench":
        cmd = ["benchmarks/bench.py", *rest]
    else:
        cmd = ["-m", "pytest", "-q", "tests", *rest]
    say("$ python " + " ".join(cmd))
    rc = run(python, *cmd).returncode
    if job == "test" and rc == 5:
        say("pytest collected no tests: that is a failure here")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
