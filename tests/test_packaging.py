"""xbench as a user gets it: a wheel installed outside the checkout, run from an empty folder.

The suite otherwise runs an editable install from the checkout, which cannot see a file
that the wheel forgot (the shipped profile, the CUDA sources). The fresh environment
reuses this environment's installed dependencies through a path entry, so it takes
seconds and no network; xbench itself comes only from the wheel.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

REPO = Path(__file__).resolve().parents[1]


def _run(cmd, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel's install folder, an empty working folder, env) for running its xbench."""
    root = tmp_path_factory.mktemp("wheel")
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["-q", "-w", str(root / "dist"), str(REPO)],
        cwd=root,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "dist").glob("xbench-*.whl")
    target = root / "site"
    installed = _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--target", str(target), str(wheel)]
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    work = root / "empty"
    work.mkdir()
    # The wheel's folder first on the path: Python's path finder runs before the editable
    # install's finder, so `xbench` comes from the wheel; torch, MPI and NVRTC come from
    # this environment, where their own loaders look for their libraries.
    env = {k: v for k, v in os.environ.items() if k != "XBENCH_CUDA_DIR"}
    env["PYTHONPATH"] = str(target)
    env["XBENCH_CACHE_DIR"] = str(root / "cache")  # compile the wheel's own CUDA sources
    return target, work, env


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_wheel_is_what_runs(installed):
    target, work, env = installed
    where = _run(
        [sys.executable, "-c", "import xbench.resources as r; print(r.__file__, r.profiles_dir())"],
        cwd=work,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    module, profiles = where.stdout.split()
    assert module.startswith(str(target)) and profiles.startswith(str(target))
    assert (Path(profiles) / "h100-priors.toml").is_file()


def test_version_names_the_revision(installed):
    target, work, env = installed
    r = _run([str(target / "bin" / "xbench"), "--version"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("xbench 0.") and "(git " in r.stdout
    head = _run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"]).stdout.strip()
    assert head in r.stdout  # stamped into the wheel at build time


def test_decide_finds_the_shipped_profile(installed):
    target, work, env = installed
    r = _run(
        [str(target / "bin" / "xbench"), "decide", "--payload", "1KB", "--out", "d.parquet"],
        cwd=work,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(work / "d.parquet")
    assert table.num_rows > 0 and {"decision", "b_star", "u_star"} <= set(table.column_names)


def test_simulate_and_decide_find_the_shipped_scenarios_by_name(installed):
    target, work, env = installed
    xbench = str(target / "bin" / "xbench")
    r = _run([xbench, "simulate", "moska-shared-chunk", "--format", "json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["simulation"]
    assert {row["policy"] for row in rows} >= {"route", "fetch", "predicate"}, rows
    r = _run([xbench, "decide", "--scenario", "span-fanout", "--format", "csv"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert "decision" in header.split(",") and len(rows) > 1, r.stdout


def test_env_compiles_the_shipped_cuda_sources(installed):
    pytest.importorskip("cuda.core", reason="cuda-core is not installed here")
    target, work, env = installed
    r = _run([str(target / "bin" / "xbench"), "env", "--format", "json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    caps = {c["capability"]: c for c in json.loads(r.stdout)}
    assert "compiles 4 sources to sm_90" in caps["kernel backend cuda-ref"]["detail"], caps
    assert any((Path(env["XBENCH_CACHE_DIR"])).glob("*.cubin"))


def test_every_package_is_in_the_wheel():
    """setuptools finds packages by pattern; a folder without __init__.py would be left out."""
    folders = {p.parent for p in (REPO / "xbench").rglob("*.py")}
    missing = [str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()]
    assert not missing, f"add __init__.py to {missing}"
    # and the version has one home, read by setuptools without importing xbench
    tree = ast.parse((REPO / "xbench" / "version.py").read_text())
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "__version__" for n in tree.body)


def test_the_lowest_run_holds_every_runtime_dependency_to_its_floor(tmp_path):
    """`make test-lowest`'s constraints: one pin per runtime dependency and the mpich extra
    (torch aside: the CPU pin), each the oldest release its range admits; a dependency
    without a floor is named, as its oldest release cannot be tried."""
    from lowest_constraints import LINE_FLOORS, NOT_PINNED, constraints
    from packaging.requirements import Requirement

    from xbench.files import tomllib  # (tomli before Python 3.11)

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {
        Requirement(r).name: Requirement(r)
        for r in [*project["dependencies"], *project["optional-dependencies"]["mpich"]]
    }
    pins = {
        Requirement(line).name: Requirement(line) for line in constraints(REPO / "pyproject.toml")
    }
    assert set(pins) == set(declared) - NOT_PINNED
    for name, pin in pins.items():
        (spec,) = pin.specifier
        floor = spec.version.removesuffix(".*")
        assert spec.operator == "==" and declared[name].specifier.contains(floor), (name, pin)
        if name not in LINE_FLOORS:  # held exactly at the declared floor
            assert f">={floor}" in str(declared[name].specifier), (name, pin)
        assert pin.marker == declared[name].marker, name
    loose = tmp_path / "pyproject.toml"
    loose.write_text(
        '[project]\ndependencies = ["rich"]\n[project.optional-dependencies]\nmpich = []\n'
    )
    r = _run([sys.executable, str(REPO / "tests" / "lowest_constraints.py"), str(loose)])
    assert (
        r.returncode == 1
        and r.stderr.strip() == f"'rich' has no '>=' floor; give it one in {loose}"
    )


def _one_file_wheel(folder: Path, version: str) -> None:
    """A wheel named torch whose version says which build it stands for, in `folder`, with
    the index.html pip reads from a file: index (and ignores as find-links)."""
    import base64
    import hashlib
    import zipfile

    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [
        f"{name},sha256="
        + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")
        + f",{len(text.encode())}"
        for name, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    (folder / "index.html").write_text(f'<a href="{name.replace("+", "%2B")}">{name}</a>\n')


@pytest.mark.parametrize("source", ["cpu index", "find-links"])
def test_make_installs_the_cpu_build_of_torch_never_the_cuda_build_of_the_same_version(
    tmp_path, source
):
    """PyPI's Linux torch 2.13.0 is a CUDA build (several GB with its nvidia-* wheels);
    `make cpu-torch` (what `make install` runs without a GPU) takes 2.13.0+cpu from pip's
    own sources when they hold it, else from PyTorch's CPU index. Local indexes stand in
    for PyPI (holding only the CUDA build's version) and for PyTorch's CPU index; pip's
    configuration is set aside, so nothing here reaches the network."""
    _one_file_wheel(tmp_path / "pypi" / "torch", "2.13.0")
    cpu_index = tmp_path / "cpu"
    if source == "cpu index":
        _one_file_wheel(cpu_index / "torch", "2.13.0+cpu")
    else:  # a machine that has the wheel on disk never asks the CPU index (not there here)
        _one_file_wheel(tmp_path / "wheels", "2.13.0+cpu")
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": (tmp_path / "pypi").as_uri(),
        "PIP_TARGET": str(site),  # this environment's own torch is left as it is
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if source == "find-links":
        env["PIP_FIND_LINKS"] = str(tmp_path / "wheels")
    venv = Path(sys.executable).parent.parent
    r = _run(
        ["make", "--no-print-directory", "-C", str(REPO), "cpu-torch", f"VENV={venv}"]
        + [f"TORCH_CPU_INDEX={cpu_index.as_uri()}"],
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in site.glob("torch-*.dist-info")] == ["torch-2.13.0+cpu.dist-info"]
    asked_the_index = f"from {cpu_index.as_uri()}" in r.stdout
    assert asked_the_index == (source == "cpu index"), r.stdout
