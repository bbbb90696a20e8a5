import math

import pytest
import torch

from commbench.models import MODELS, build_model, parameter_shapes

# torchvision's figures (parameters, parameter tensors)
EXPECTED = {
    "resnet18": (11_689_512, 62),
    "resnet34": (21_797_672, 110),
    "resnet50": (25_557_032, 161),
    "resnet101": (44_549_160, 314),
    "resnet152": (60_192_808, 467),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_counts_match_torchvision(name):
    shapes = parameter_shapes(name)
    assert (sum(math.prod(s) for _, s in shapes), len(shapes)) == EXPECTED[name]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_shapes_match_torchvision_where_importable(name):
    tv = pytest.importorskip("torchvision.models")
    ref = [(n, tuple(p.shape)) for n, p in getattr(tv, name)().named_parameters()]
    assert parameter_shapes(name) == ref


def test_meta_build_allocates_nothing_and_real_build_runs():
    assert all(p.is_meta for p in build_model("resnet50", device="meta").parameters())
    model = build_model("resnet18", num_classes=10)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_names_follow_torchvision():
    names = [n for n, _ in parameter_shapes("resnet50")]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer1.0.downsample.0.weight" in names
    assert names[-2:] == ["fc.weight", "fc.bias"]


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet7")
    assert set(EXPECTED) <= set(MODELS)  # plus small models for CPU studies


# -- transformers -----------------------------------------------------------------------

def test_gpt2_small_has_gpt2s_parameters_with_the_output_layer_tied():
    shapes = parameter_shapes("gpt2-small")
    # Hugging Face's gpt2: 124,439,808 parameters; the tied lm_head is not a second one
    assert (sum(math.prod(s) for _, s in shapes), len(shapes)) == (124_439_808, 148)
    names = [n for n, _ in shapes]
    assert names.count("transformer.wte.weight") == 1 and not any("lm_head" in n for n in names)
    net = build_model("gpt2-small", device="meta")
    assert net.lm_head.weight is net.transformer.wte.weight
    assert (net.input_kind, net.vocab, net.context) == ("tokens", 50257, 1024)


def test_language_models_ignore_num_classes_and_images_stay_the_default():
    from commbench.models import input_kind

    assert parameter_shapes("gpt-tiny", num_classes=10) == parameter_shapes("gpt-tiny")
    assert input_kind(build_model("resnet18", device="meta")) == "image"
    assert input_kind(build_model("gpt-tiny", device="meta")) == "tokens"


def test_gpt_tiny_trains_for_real_and_announces_the_tied_gradient_once():
    from commbench.timing import NullTimer
    from commbench.workloads.real import RealWorkload

    wl = RealWorkload("gpt-tiny", rank=0, batch_size=8, lr=0.5)
    assert wl.inputs.shape == (8, 64) and wl.image_size is None
    # the target is the next token of each counting sequence
    assert torch.equal(wl.labels[:, :-1], wl.inputs[:, 1:])
    timer, losses = NullTimer(), []
    for _ in range(25):
        announced: list[int] = []
        wl.forward(timer)
        wl.backward(timer, announced.append)
        wl.optimizer_step(timer)
        losses.append(float(wl.loss.detach()))
        assert sorted(announced) == list(range(len(wl.params)))  # each once, wte included
    assert losses[-1] < 0.8 * losses[0], losses


def test_gpt_tiny_refuses_an_image_data_set():
    from commbench.workloads.real import RealWorkload

    with pytest.raises(ValueError, match="digits.*token ids"):
        RealWorkload("gpt-tiny", rank=0, dataset="digits")


def test_replay_of_a_tied_model_synchronises_one_gradient_per_parameter():
    from commbench.timing import NullTimer
    from commbench.workloads.synthetic import SyntheticWorkload

    wl = SyntheticWorkload("gpt-tiny", compute_ms=0.0, rank=0)
    assert wl.param_names == [n for n, _ in parameter_shapes("gpt-tiny")]
    announced: list[int] = []
    wl.forward(NullTimer())
    wl.backward(NullTimer(), announced.append)
    assert sorted(announced) == list(range(len(wl.params)))
    assert wl.numel == sum(p.numel() for p in build_model("gpt-tiny").parameters())
