"""The platform profile schema (core.profile): TOML round trip, strict reading, comments."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.cost import ALLREDUCE_ALGORITHMS
from psgdlab.core.platform.profile import Defaults, HostCPU, Link, Platform, Profile, ServerSpec, Uncertainty, Workload

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)  # quotes, backslashes, controls
comment = (
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40).map(str.rstrip).filter(bool)
)
nonneg = st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False)
positive = st.floats(1e-300, 1e300, allow_nan=False, allow_infinity=False, exclude_min=False)
counts = st.integers(1, 64)


def links():
    scatter = st.just(()) | st.lists(st.floats(0.01, 100.0), min_size=2, max_size=25).map(lambda q: tuple(sorted(q)))
    return st.builds(Link, latency_s=nonneg, bandwidth_bytes_per_s=positive, scatter=scatter)


@st.composite
def platforms(draw):
    sockets = draw(st.integers(1, 4))
    return Platform(
        name=draw(text),
        description=draw(text),
        hosts=draw(counts),
        devices_per_host=sockets * draw(counts),
        sockets_per_host=sockets,
        device=draw(text),
        pcie=draw(links()),
        nic=draw(links()),
        nvlink=draw(st.none() | links()),
        collective=draw(st.none() | links()),
        allreduce=draw(st.sampled_from(ALLREDUCE_ALGORITHMS)),
        host_memory_bandwidth_bytes_per_s=draw(positive),
        model_average_s=draw(nonneg),
        model_average_s_per_byte=draw(nonneg),
        mix_merge_s=draw(nonneg),
        mix_merge_s_per_byte=draw(nonneg),
        step_overhead_s=draw(nonneg),
        step_overhead_s_per_byte=draw(nonneg),
        staging=draw(st.sampled_from(["direct", "host"])),
        server=draw(
            st.builds(
                ServerSpec,
                latency_s=nonneg,
                bandwidth_bytes_per_s=positive,
                service_overhead_s=nonneg,
                apply_on_host=st.booleans(),
            )
        ),
        host_cpu=draw(
            st.none() | st.builds(HostCPU, cores_per_host=counts, work_per_message_s=nonneg, work_per_byte_s=nonneg)
        ),
    )


@st.composite
def workloads(draw):
    mean = draw(st.floats(1e-6, 1e3))
    kind = draw(st.sampled_from(["const", "lognormal", "gamma", "normal"]))
    compute = repr(mean) if kind == "const" else f"{kind}:{mean!r}:{draw(st.floats(0.0, 2.0))!r}"
    return Workload(
        name=draw(text),
        description=draw(text),
        n_params=draw(st.integers(1, 10**12)),
        itemsize=draw(st.sampled_from([1, 2, 4, 8])),
        compute=compute,
        reference_batch=draw(counts),
        batch_per_worker=draw(counts),
        compute_fixed_s=draw(st.floats(0.0, mean)),
        compute_jitter_s=draw(nonneg),
        input_bytes_per_sample=draw(nonneg),
        loader_buffer_samples=draw(st.just(0.0) | st.floats(1.0, 1e9)),
        loader_s_per_sample=draw(nonneg),
        loader_buffer_cv=draw(st.floats(0.0, 10.0)),
        samples_per_epoch=draw(positive),
        epochs=draw(positive),
        sample_unit=draw(text),
    )


@st.composite
def profiles(draw):
    bare = Profile(
        platform=draw(platforms()),
        workload=draw(workloads()),
        defaults=Defaults(
            algorithms=tuple(draw(st.lists(text, max_size=4))),
            workers=tuple(draw(st.lists(counts, max_size=4))),
            period=draw(st.none() | counts),
        ),
    )
    paths = sorted(bare.paths())
    keys = draw(st.lists(st.sampled_from(paths), unique=True, max_size=8))
    notes = tuple(draw(st.lists(st.just("") | comment | comment.map(lambda c: "   " + c), max_size=5)))
    return Profile(
        platform=bare.platform,
        workload=bare.workload,
        defaults=bare.defaults,
        notes=notes,
        provenance={k: draw(comment) for k in keys},
    )


@settings(max_examples=200, deadline=None)
@given(profiles())
def test_profile_to_toml_and_back_is_the_identity(profile):
    text = profile.to_toml()
    back = Profile.from_toml(text)
    assert back == profile
    assert back.to_toml() == text
    for name in ("platform", "workload", "defaults"):  # floats exactly, not approximately
        assert repr(getattr(back, name)) == repr(getattr(profile, name))


@pytest.mark.parametrize("scatter", [(1.0,), (2.0, 1.0), (0.0, 1.0), (1.0, float("inf"))])
def test_a_links_scatter_must_be_positive_ordered_quantiles(scatter):
    with pytest.raises(ConfigError, match="scatter"):
        Link(scatter=scatter)


def test_unknown_keys_get_the_closest_key():
    doc = Profile(platform=Platform(), workload=Workload()).to_toml().replace("latency_s", "latncy_s", 1)
    with pytest.raises(ConfigError, match="did you mean 'latency_s'"):
        Profile.from_toml(doc)
    with pytest.raises(ConfigError, match="needs both a \\[platform\\] and a \\[workload\\] table"):
        Profile.from_dict({"platform": {}})
    with pytest.raises(ConfigError, match="unknown key 'workloads'; did you mean 'workload'"):
        Profile.from_dict({"platform": {}, "workloads": {}})


def test_comments_are_validated_and_read_back():
    with pytest.raises(ConfigError, match="provenance key"):
        Profile(platform=Platform(), workload=Workload(), provenance={"platform.host_cpu": "absent table"})
    with pytest.raises(ConfigError, match="note"):
        Profile(platform=Platform(), workload=Workload(), notes=("two\nlines",))
    doc = (
        '# head\n[platform]  # the cluster\nname = "a # not a comment"   # tag\n[workload]\n'
        "# a note further down\nn_params = 5 #x\n"
    )
    p = Profile.from_toml(doc)
    assert p.platform.name == "a # not a comment" and p.workload.n_params == 5
    assert p.notes == ("head", "a note further down")
    assert dict(p.provenance) == {"platform": "the cluster", "platform.name": "tag", "workload.n_params": "x"}


def test_write_is_atomic_and_reads_back(tmp_path):
    p = Profile(platform=Platform(hosts=3), workload=Workload(), notes=("x",))
    path = p.write(tmp_path / "p.toml")
    assert Profile.read(path) == p and tomllib.loads(path.read_text())["platform"]["hosts"] == 3
    with pytest.raises(ConfigError, match="does not exist"):
        Profile.read(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[platform\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        Profile.read(tmp_path / "bad.toml")


@st.composite
def uncertainties(draw):
    paths = draw(
        st.lists(
            st.sampled_from(
                [
                    "platform.pcie.bandwidth_bytes_per_s",
                    "platform.nic.bandwidth_bytes_per_s",
                    "platform.host_memory_bandwidth_bytes_per_s",
                    "workload.n_params",
                ]
            ),
            unique=True,
            max_size=4,
        )
    )
    n = len(paths)
    rho = draw(st.floats(-1.0, 1.0))
    corr = tuple(tuple(1.0 if i == j else rho for j in range(n)) for i in range(n)) if draw(st.booleans()) else ()
    return Uncertainty(
        parameters=tuple(paths),
        log_sd=tuple(draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))),
        correlation=corr,
        unpinned=tuple(draw(st.lists(st.sampled_from(paths), unique=True)) if paths else ()),
        noise_cv=draw(st.floats(0.0, 1.0)),
        noise_processes_per_core=draw(st.none() | st.floats(0.05, 16.0)),
        loo_error=draw(st.none() | st.floats(0.0, 1.0)),
    )


@given(uncertainties())
@settings(max_examples=50, deadline=None)
def test_uncertainty_round_trips_and_its_covariance_is_symmetric(u):
    p = Profile(platform=Platform(), workload=Workload(), uncertainty=u)
    assert Profile.from_toml(p.to_toml()) == p
    cov = u.covariance()
    assert all(cov[i][j] == cov[j][i] for i in range(len(cov)) for j in range(len(cov)))
    assert all(cov[i][i] == pytest.approx(u.log_sd[i] ** 2) for i in range(len(cov)))


def test_uncertainty_rejects_a_path_that_names_no_positive_value():
    with pytest.raises(ConfigError, match=r"did you mean 'platform\.pcie\.bandwidth_bytes_per_s'"):
        Profile(
            platform=Platform(),
            workload=Workload(),
            uncertainty=Uncertainty(parameters=("platform.pcie.bandwith",), log_sd=(0.1,)),
        )
    with pytest.raises(ConfigError, match="must be one of the parameters"):
        Uncertainty(parameters=("a",), log_sd=(0.1,), unpinned=("b",))
    with pytest.raises(ConfigError, match=r"noise_processes_per_core.*must be > 0"):
        Uncertainty(noise_processes_per_core=0.0)


def test_with_values_replaces_by_path_and_validates_again():
    p = Profile(platform=Platform(), workload=Workload())
    q = p.with_values({"platform.nic.latency_s": 2e-5, "workload.n_params": 7})
    assert q.get("platform.nic.latency_s") == 2e-5 and q.workload.n_params == 7
    with pytest.raises(ConfigError, match="latency_s"):
        p.with_values({"platform.nic.latency_s": -1.0})
    with pytest.raises(ConfigError, match="names no value"):
        p.with_values({"platform.nic.latncy_s": 1.0})
