"""The sources table (sim/presets/sources.toml) resolves every tag a preset or a named workload
cites, and the presets of today's clusters tag every value they set."""

from __future__ import annotations

from pathlib import Path

import pytest

from psgdlab.core.platform.profile import Profile
from psgdlab.core.platform.workloads import WORKLOADS
from psgdlab.sim.workload import SOURCE_KINDS, preset_names, preset_path, preset_sources, provenance_tags

#: the presets of today's clusters, written with a tag on every value
TAGGED_PRESETS = ("a100-sxm-hdr", "h100-sxm-ndr", "l40s-pcie-100gbe")
#: values that name or describe, and cite nothing
NAMES = {"name", "description", "sample_unit"}


def _profiles() -> list[tuple[str, Profile]]:
    """Every profile shipped beside the presets: the presets and the fit's base profiles."""
    fit = sorted(Path(str(preset_path(preset_names()[0]))).parent.joinpath("fit").glob("*.toml"))
    return [(name, Profile.read(preset_path(name))) for name in preset_names()] + [
        (p.name, Profile.read(p)) for p in fit
    ]


def test_every_source_has_a_kind_and_a_citation():
    sources = preset_sources()
    assert sources
    for tag, entry in sources.items():
        assert set(entry) == {"kind", "citation", "url"}, tag
        assert entry["kind"] in SOURCE_KINDS, tag
        assert len(entry["citation"]) > 20, tag
        assert entry["url"] == "" or entry["url"].startswith("https://"), tag


@pytest.mark.parametrize("name,profile", _profiles(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_tag_of_a_shipped_profile_is_resolved(name, profile):
    sources = preset_sources()
    cited = {tag for comment in profile.provenance.values() for tag in provenance_tags(comment)}
    assert cited, f"{name} cites no source"
    assert cited <= set(sources), f"{name} cites tags the sources table lacks: {sorted(cited - set(sources))}"


def test_every_tag_of_a_named_workload_is_resolved():
    sources = preset_sources()
    for name, entry in WORKLOADS.items():
        cited = {tag for comment in entry.provenance.values() for tag in provenance_tags(comment)}
        assert cited <= set(sources), f"{name}: {sorted(cited - set(sources))}"


@pytest.mark.parametrize("name", TAGGED_PRESETS)
def test_todays_presets_tag_every_value_they_set(name):
    """Every key the file sets in [platform] and [workload] (and their sub-tables) carries a tag:
    a spec-sheet figure with its source, an efficiency applied to one, or an assumption."""
    profile = Profile.read(preset_path(name))
    text = preset_path(name).read_text()
    table = ""
    for line in text.splitlines():
        code = line.split("#")[0].strip()
        if code.startswith("["):
            table = code.strip("[]")
        elif "=" in code and table.startswith(("platform", "workload")):
            key = code.split("=")[0].strip()
            if key in NAMES:
                continue
            assert provenance_tags(profile.provenance.get(f"{table}.{key}", "")), f"{name}: {table}.{key} untagged"


def test_a_tag_is_the_first_word_of_a_bracket():
    assert provenance_tags("[S000 §5.1] 16 GB/s; [INF, F.8] host staging") == ("S000", "INF")
    assert provenance_tags("[NV-A100] 312 TFLOPS [PCIE] x16") == ("NV-A100", "PCIE")
    assert provenance_tags("a range [0, 1] cites nothing") == ()
