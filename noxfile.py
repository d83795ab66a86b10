"""The test sessions, each in its own virtual environment: ``nox`` runs them all (the README's test
command, ``pip install nox && nox``; ``.ci/run`` runs it on a clean checkout).

JAX 0.10 needs NumPy 2 and MindSpore 2.10 NumPy 1, so no one environment holds every framework:

- ``tests``: the suite with the test extra (PyTorch, MindSpore, NumPy 1.x), but the JAX tests;
- ``jax``: the JAX tests (``tests/frameworks/test_jax_*.py``) with the jax extra (JAX, NumPy 2).

opforge is compiled once per run: the first session builds the wheel of this checkout
(``pip wheel``) and every session installs that wheel with its extra. Arguments after ``--`` go to
pytest: ``nox -s tests -- -m "not slow"``; ``nox -s jax`` runs one session.
"""

from __future__ import annotations

import glob
import tempfile

import nox

nox.options.sessions = ["tests", "jax"]
nox.options.default_venv_backend = "venv"  # (pip, which reads this machine's pip configuration)

JAX_TESTS = "tests/frameworks/test_jax_*.py"
_wheel: list[str] = []


def wheel(session: nox.Session) -> str:
    """The wheel of this checkout, built the first time a session asks for it."""
    if not _wheel:
        out = tempfile.mkdtemp(prefix="opforge-wheel-")
        session.run("python", "-m", "pip", "wheel", ".", "--no-deps", "-w", out)
        (path,) = glob.glob(f"{out}/opforge-*.whl")
        _wheel.append(path)
    return _wheel[0]


@nox.session
def tests(session: nox.Session) -> None:
    """Every test but the JAX ones, with PyTorch and MindSpore (NumPy 1.x)."""
    session.install(f"{wheel(session)}[test]")
    # (tests/test_build.py checks this wheel's name and contents instead of building another)
    # (--durations: the slowest tests in the log, to see where CI's time goes)
    session.run("python", "-m", "pytest", f"--ignore-glob={JAX_TESTS}", "--durations=15", *session.posargs,
                env={"OPFORGE_WHEEL": wheel(session)})


@nox.session
def jax(session: nox.Session) -> None:
    """opforge.jax's tests, with JAX (NumPy 2)."""
    session.install(f"{wheel(session)}[jax]", "pytest>=8", "pytest-xdist")
    # (test by test over the workers: two files, most of the time in one)
    session.run("python", "-m", "pytest", "--dist", "load", *sorted(glob.glob(JAX_TESTS)), *session.posargs)
