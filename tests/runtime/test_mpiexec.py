"""Which ``mpiexec`` starts the ranks of ``psgdlab train --backend mpi``: ``--mpiexec PATH``, else
that of the MPI mpi4py loads (the ``mpich`` wheel's where it is installed here, else the one on
``PATH``, a cluster's); a wheel the install did not ask for never shadows a cluster's MPI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.runtime.launcher import launch
from psgdlab.tests.runtime._runtime_helpers import train_fails


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def cluster_mpi(tmp_path, monkeypatch):
    """A cluster's MPI on PATH (a stand-in mpiexec in a folder of its own)."""
    mpiexec = _executable(tmp_path / "cluster-mpi" / "bin" / "mpiexec")
    monkeypatch.setenv("PATH", f"{mpiexec.parent}{os.pathsep}{os.environ['PATH']}")
    return mpiexec


def test_without_the_wheel_the_mpiexec_on_path_starts_the_ranks(cluster_mpi, monkeypatch):
    monkeypatch.setattr(launch, "_wheel_mpiexec", lambda: None)
    assert launch.mpiexec_path() == cluster_mpi


def test_with_the_wheel_its_mpiexec_matches_the_library_mpi4py_loads(cluster_mpi, tmp_path, monkeypatch):
    wheel = _executable(tmp_path / "venv" / "bin" / "mpiexec")
    monkeypatch.setattr(launch, "_wheel_mpiexec", lambda: wheel)
    assert launch.mpiexec_path() == wheel


def test_the_chosen_mpiexec_wins_and_a_missing_one_is_refused(cluster_mpi, tmp_path, monkeypatch):
    chosen = _executable(tmp_path / "other" / "mpiexec")
    monkeypatch.setattr(launch, "_wheel_mpiexec", lambda: cluster_mpi)
    assert launch.mpiexec_path(str(chosen)) == chosen
    with pytest.raises(ConfigError, match=r"^mpiexec \('/nowhere/mpiexec'\) is not an executable file$"):
        launch.mpiexec_path("/nowhere/mpiexec")


def test_no_mpi_at_all_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_wheel_mpiexec", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"needs mpiexec, and there is none: load your cluster's MPI.*psgdlab\[mpich\]"
    ):
        launch.mpiexec_path()


def test_the_wheel_installed_here_is_found_by_its_files():
    wheel = launch._wheel_mpiexec()
    if wheel is None:
        pytest.skip("the mpich wheel is not installed in this environment")
    assert wheel.name == "mpiexec" and wheel.is_file() and os.access(wheel, os.X_OK)


def test_mpiexec_applies_only_to_the_mpi_backend(capsys, tmp_path):
    train_fails(
        capsys,
        ["--backend", "gloo", "--mpiexec", "mpiexec", "--out", str(tmp_path)],
        r"mpiexec \('mpiexec'\) applies only with --backend mpi, not gloo",
    )


@pytest.mark.mpi
@pytest.mark.distributed
def test_train_starts_its_ranks_with_the_chosen_mpiexec(tmp_path, capsys):
    wheel = launch._wheel_mpiexec()
    if wheel is None:
        pytest.skip("the mpich wheel is not installed in this environment")
    seen = tmp_path / "started-by"
    wrapper = _executable(
        tmp_path / "bin" / "my-mpiexec", f'#!/bin/sh\nprintf "%s\\n" "$*" > {seen}\nexec {wheel} "$@"\n'
    )
    argv = ["train", "--backend", "mpi", "--mpiexec", str(wrapper), "--model", "least-squares", "--steps", "3"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 2
    assert seen.read_text().split()[:2] == ["-n", "2"] and sys.executable in seen.read_text()
