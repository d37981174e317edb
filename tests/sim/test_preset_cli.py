"""psgdlab preset list/show and workload list/show: what they print, and that what ``show`` prints
is a file ``--platform`` (``--workload``) takes unchanged."""

from __future__ import annotations

import json

import pytest

from psgdlab.cli import main
from psgdlab.core.platform.workloads import WORKLOADS, load_workload, workload, workload_names
from psgdlab.sim.workload import preset_names, preset_sources


def _out(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_preset_list_one_line_each(capsys):
    code, out, _ = _out(capsys, ["preset", "list"])
    assert code == 0
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(preset_names())
    h100 = next(line for line in lines if line.startswith("h100-sxm-ndr"))
    assert " 8 x 8 " in h100 and "H100" in h100 and "NVLink" in h100 and "3200 Gb/s" in h100
    code, out, _ = _out(capsys, ["preset", "list", "--json"])
    rows = json.loads(out)
    assert [r["name"] for r in rows] == list(preset_names())
    assert {r["inside_host"] for r in rows} == {"NVLink", "PCIe"}


@pytest.mark.parametrize("name", preset_names())
def test_a_shown_preset_predicts_as_the_preset(tmp_path, capsys, name):
    """``preset show NAME > p.toml; predict --platform p.toml`` gives the rows of ``--preset NAME``
    (intervals included: the [uncertainty] table travels too)."""
    code, text, _ = _out(capsys, ["preset", "show", name])
    assert code == 0
    path = tmp_path / "p.toml"
    path.write_text(text)
    sweep = ["--algorithm", "ssgd,adpsgd", "--workers", "1,8", "--steps", "30", "--jobs", "1", "--json"]
    rows = []
    for source in (["--preset", name], ["--platform", str(path)]):
        code, out, _ = _out(capsys, ["predict", *source, *sweep, "--out", str(tmp_path / source[0][2:])])
        assert code == 0
        rows.append(json.loads(out)["rows"])
    assert rows[0] == rows[1] and len(rows[0]) == 4


def test_preset_show_json_resolves_its_sources(capsys):
    code, out, _ = _out(capsys, ["preset", "show", "a100-sxm-hdr", "--json"])
    doc = json.loads(out)
    assert code == 0 and doc["platform"]["nvlink"]["bandwidth_bytes_per_s"] == 3e11
    assert doc["sources"] and all(doc["sources"][tag] == preset_sources()[tag] for tag in doc["sources"])
    assert doc["provenance"]["platform.device_flops_per_s"].startswith("[NV-A100]")


@pytest.mark.parametrize(
    "argv,hint",
    [
        (["preset", "show", "h100"], "did you mean 'h100-sxm-ndr'?"),
        (["preset", "show", "a100-sxm-ndr"], "did you mean 'h100-sxm-ndr' or 'a100-sxm-hdr'?"),
        (["workload", "show", "conformer"], "did you mean 'conformer-120m'?"),
    ],
)
def test_an_unknown_name_is_one_line_with_the_closest_names(capsys, argv, hint):
    code, out, err = _out(capsys, argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and hint in err and "is not known" in err


def test_workload_list_one_line_each(capsys):
    code, out, _ = _out(capsys, ["workload", "list"])
    lines = out.strip().splitlines()
    assert code == 0 and [line.split()[0] for line in lines] == sorted(WORKLOADS)
    assert "--model blstm" in next(line for line in lines if line.startswith("bilstm-43m"))
    code, out, _ = _out(capsys, ["workload", "list", "--json"])
    assert {r["name"]: r["n_params"] for r in json.loads(out)} == {k: e.workload.n_params for k, e in WORKLOADS.items()}


@pytest.mark.parametrize("name", workload_names())
def test_a_shown_workload_loads_as_the_named_one(tmp_path, capsys, name):
    code, text, _ = _out(capsys, ["workload", "show", name])
    assert code == 0 and text.count("[workload]") == 1
    path = tmp_path / "w.toml"
    path.write_text(text)
    assert load_workload(str(path)) == workload(name)
    code, out, _ = _out(capsys, ["workload", "show", name, "--json"])
    assert json.loads(out)["n_params"] == workload(name).n_params
