"""The wheel `make wheel` builds can be published: a manylinux tag that its symbols bear out (auditwheel), and
installed in a fresh venv (its dependencies from the index) it runs with its compiled row stage.

`make wheel-test` runs this file, in `make test`'s first parallel group; the unit targets run tests/unit only.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from cdcd import __version__

ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR = ROOT / "build" / "wheel"  # the Makefile's WHEEL_DIR
# The Makefile's `--compatibility manylinux2014`: glibc 2.17's symbols at most.
PLATFORM = f"manylinux_2_17_{platform.machine()}"
PYTHON = f"cp{sys.version_info.major}{sys.version_info.minor}"


def _run(args: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The wheel of the sources as they are now: `make wheel` (cargo's target dir kept: ~2 s when warm). Called
    from `make test`, whose jobserver this make must not try to join."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    _run(["make", "--no-print-directory", "wheel"], cwd=ROOT, env=env)
    (built,) = WHEEL_DIR.glob("*.whl")
    return built


def _tags(wheel: Path) -> tuple[set[str], set[str]]:
    """The wheel's tags as its file name gives them, and as its WHEEL metadata does."""
    name, version, python, abi, platforms = wheel.name.removesuffix(".whl").split("-")
    assert (name, version) == ("cdcd", __version__)
    from_name = {f"{python}-{abi}-{p}" for p in platforms.split(".")}
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"cdcd-{__version__}.dist-info/WHEEL").decode()
    from_metadata = {line.removeprefix("Tag: ") for line in metadata.splitlines() if line.startswith("Tag: ")}
    return from_name, from_metadata


def test_the_wheel_is_manylinux_and_its_symbols_allow_it(wheel: Path) -> None:
    from_name, from_metadata = _tags(wheel)
    assert from_name == from_metadata
    assert f"{PYTHON}-{PYTHON}-{PLATFORM}" in from_name
    assert all("-manylinux" in tag for tag in from_name), from_name  # never linux_x86_64: not publishable
    # auditwheel reads the compiled module's versioned symbols and libraries against the manylinux policies
    shown = " ".join(_run([Path(sys.executable).parent / "auditwheel", "show", wheel]).split())
    assert f'is consistent with the following platform tag: "{PLATFORM}"' in shown, shown


def test_the_wheel_installs_in_a_fresh_venv_and_runs_compiled(wheel: Path, tmp_path: Path) -> None:
    """A venv of nothing but the wheel and its dependencies; outside the source tree, without CDCD_* or
    PYTHONPATH, so only the installed package can answer. This venv's pip installs into it (`--python`), which
    saves the fresh venv its own copy of pip; `--no-compile` saves compiling every dependency's bytecode."""
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    _run([*pip, "install", "--quiet", "--no-compile", wheel])
    (installed,) = fresh.glob("lib/python*/site-packages/cdcd/_native.*.so")
    assert installed.name == f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    shown = _run([fresh / "bin" / "cdcd", "--version"], cwd=tmp_path, env=env)
    assert shown == f"cdcd {__version__} (row stage: native)\n"
