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
