"""The published-results inputs (issue 48, part 4): the file parses, every input has a
value, a unit and a source, and the loader refuses a file that breaks that."""

from __future__ import annotations

import math

import pytest

from analysis.published import HOROVOD_512, NO_SOURCE, PublishedError, load

#: what a prediction of a published scaling efficiency needs (issue 48, part 4)
REQUIRED = ["efficiency_definition", "batch_per_gpu", "servers", "gpus_per_server",
            "intra_node_link", "intra_node_rate", "inter_node_rate", "inter_node_transport",
            "per_step_latency", "allreduce_algorithm", "fusion_threshold", "cycle_time"]
PER_MODEL = ["step_compute", "gradient_bytes", "backward_share"]


def test_horovod_512_parses_with_its_three_checks():
    pub = load(HOROVOD_512)
    assert [(c.model, c.gpus, c.efficiency) for c in pub.checks] == [
        ("resnet101", 512, 0.90), ("inception_v3", 512, 0.90), ("vgg16", 512, 0.68)]
    assert pub.vary == 0.20
    assert pub.input("servers").value * pub.input("gpus_per_server").value == 512
    assert "horovod" in pub.source.lower() and "68%" in pub.source


def test_every_input_has_a_value_a_unit_and_a_source():
    pub = load(HOROVOD_512)
    assert len(pub.inputs) >= len(REQUIRED) + 3 * len(PER_MODEL)
    for key, inp in pub.inputs.items():
        assert inp.value not in ("", None), key
        assert inp.unit.strip() and inp.source.strip(), key
        if not inp.sourced:  # then the assumption and its reason are written down
            assert inp.source.lower().startswith(NO_SOURCE) and len(inp.note) > 40, key
    for key in REQUIRED:
        pub.input(key)
    for check in pub.checks:
        assert sorted(pub.model_inputs(check.model)) == sorted(PER_MODEL), check.model


def test_the_settings_of_the_time_are_fixed_not_varied():
    pub = load(HOROVOD_512)
    assert pub.input("fusion_threshold").value == 64 * 2**20
    assert pub.input("fusion_threshold").band(pub.vary) == (64 * 2**20, 64 * 2**20)
    assert (pub.input("cycle_time").value, pub.input("cycle_time").unit) == (5.0, "ms")
    assert not pub.input("servers").uncertain
    low, high = pub.input("model.vgg16.step_compute").band(pub.vary)
    assert math.isclose(low, 0.4889 * 0.8) and math.isclose(high, 0.4889 * 1.2)
    with pytest.raises(ValueError, match="text"):
        pub.input("allreduce_algorithm").band(pub.vary)


def test_compute_is_the_published_single_gpu_throughput_at_batch_64():
    pub = load(HOROVOD_512)
    images_per_s = {"resnet101": 119.4, "inception_v3": 134.4, "vgg16": 130.9}
    for model, rate in images_per_s.items():
        step = pub.input(f"model.{model}.step_compute")
        assert step.unit == "s" and step.uncertain
        assert math.isclose(step.value, 64 / rate, rel_tol=1e-3), model


def test_gradient_bytes_are_the_registry_models_the_checks_name():
    from commbench.models import parameter_shapes

    pub = load(HOROVOD_512)
    for check in pub.checks:
        shapes = parameter_shapes(check.model, kwargs=check.model_kwargs)
        grad = pub.input(f"model.{check.model}.gradient_bytes")
        assert grad.value == 4 * sum(math.prod(s) for _, s in shapes), check.model
        assert not grad.uncertain
    # tf_cnn_benchmarks' Inception V3 has no auxiliary head
    assert pub.checks[1].model_kwargs == {"aux_logits": False}


GOOD_INPUT = '[inputs.cycle_time]\nvalue = 5.0\nunit = "ms"\nsource = "operations.cc"\n'
HEAD = ('schema = 1\nvary = 0.2\n[published]\ngpus = 8\nsource = "a page"\n'
        '[[published.check]]\nmodel = "vgg16"\nefficiency = 0.7\n')


@pytest.mark.parametrize("body,message", [
    ('[inputs.cycle_time]\nvalue = 5.0\nunit = "ms"\n', "inputs.cycle_time: source is missing"),
    ('[inputs.cycle_time]\nvalue = 5.0\nsource = "x"\n', "inputs.cycle_time: unit is missing"),
    ('[inputs.x]\nvalue = 1\nunit = "s"\nsource = "no source found"\n', "a note must give"),
    ('[inputs.x]\nvalue = "ring"\nunit = "-"\nsource = "y"\nuncertain = true\n',
     "cannot be varied"),
    ('[inputs.x]\nvalue = 1\nunit = "s"\nsource = "y"\nsorce = "z"\n', "unknown key sorce"),
    ('[inputs]\nx = 3\n', "inputs.x is neither an input"),
    ('[inputs.x]\nvalue = true\nunit = "-"\nsource = "y"\n', "value must be a number or text"),
])
def test_a_bad_input_is_refused_naming_it(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + body)
    with pytest.raises(PublishedError, match=message):
        load(path)


@pytest.mark.parametrize("head,message", [
    (HEAD.replace("schema = 1", "schema = 2"), "schema must be 1"),
    (HEAD.replace("vary = 0.2", "vary = 20"), "vary must be a fraction"),
    (HEAD.replace("efficiency = 0.7", "efficiency = 70"), "efficiency must be a fraction"),
    (HEAD.replace('model = "vgg16"', "model = 16"), "model must be text"),
    ("schema = 1\nvary = 0.2\n[published\n", "not TOML"),
])
def test_a_bad_file_is_refused_naming_the_key(tmp_path, head, message):
    path = tmp_path / "bad.toml"
    path.write_text(head + GOOD_INPUT)
    with pytest.raises(PublishedError, match=message):
        load(path)
    with pytest.raises(PublishedError, match="cannot read"):
        load(tmp_path / "missing.toml")
