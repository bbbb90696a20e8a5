"""The models of Horovod's published 512-GPU results (VGG-16, Inception V3) and the
advisor's held-out ViT (a factory, not registered)."""

from __future__ import annotations

import math

import pytest
import torch

from commbench.models import MODELS, build_model, parameter_shapes
from commbench.timing import NullTimer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# torchvision's figures (parameters, parameter tensors) at 1000 classes
EXPECTED = {
    "vgg16": (138_357_544, 32),
    "inception_v3": (27_161_264, 292),  # aux_logits=True, torchvision's default
}
#: Inception V3's auxiliary classifier: conv0 and conv1 (conv, bn weight, bn bias), fc
AUX = ["AuxLogits.conv0.conv.weight", "AuxLogits.conv0.bn.weight", "AuxLogits.conv0.bn.bias",
       "AuxLogits.conv1.conv.weight", "AuxLogits.conv1.bn.weight", "AuxLogits.conv1.bn.bias",
       "AuxLogits.fc.weight", "AuxLogits.fc.bias"]
VIT = "commbench.models.heldout_vit:vit"


def _count(shapes: list[tuple[str, tuple[int, ...]]]) -> tuple[int, int]:
    return sum(math.prod(s) for _, s in shapes), len(shapes)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_counts_match_torchvision(name):
    assert name in MODELS
    assert _count(parameter_shapes(name)) == EXPECTED[name]
    assert all(p.is_meta for p in build_model(name, device="meta").parameters())


@pytest.mark.parametrize("name", list(EXPECTED))
def test_shapes_match_torchvision_where_importable(name):
    tv = pytest.importorskip("torchvision.models")
    net = getattr(tv, name)(weights=None, init_weights=False) if name == "inception_v3" \
        else getattr(tv, name)(weights=None)
    assert parameter_shapes(name) == [(n, tuple(p.shape)) for n, p in net.named_parameters()]


def test_vgg16_names_follow_torchvision_and_its_gradient_is_in_the_classifier():
    shapes = dict(parameter_shapes("vgg16"))
    convs = [n for n in shapes if n.startswith("features.") and n.endswith(".weight")]
    assert convs == [f"features.{i}.weight"
                     for i in (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)]
    assert shapes["classifier.0.weight"] == (4096, 512 * 7 * 7)
    assert shapes["classifier.6.weight"] == (1000, 4096)
    fc = sum(math.prod(s) for n, s in shapes.items() if n.startswith("classifier."))
    assert fc == 123_642_856  # 89 % of the model: why compute is spread by FLOPs


def test_inception_registers_the_aux_head_between_6e_and_7a_and_can_drop_it():
    names = [n for n, _ in parameter_shapes("inception_v3")]
    assert names[:3] == ["Conv2d_1a_3x3.conv.weight", "Conv2d_1a_3x3.bn.weight",
                         "Conv2d_1a_3x3.bn.bias"]
    first = names.index(AUX[0])
    assert names[first:first + len(AUX)] == AUX
    assert names[first - 1].startswith("Mixed_6e.") and names[first + len(AUX)].startswith(
        "Mixed_7a.")
    assert names[-2:] == ["fc.weight", "fc.bias"]
    no_aux = parameter_shapes("inception_v3", kwargs={"aux_logits": False})
    assert _count(no_aux) == (23_834_568, 284)
    assert [n for n, _ in no_aux] == [n for n in names if not n.startswith("AuxLogits.")]


def test_vgg16_runs_a_small_image():
    torch.manual_seed(0)
    net = build_model("vgg16", num_classes=10).eval()
    with torch.no_grad():  # 120 M parameters at 10 classes: forward only, no gradients
        assert net(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_inception_main_path_runs_from_75_px_and_the_real_workload_names_the_aux_unused():
    from commbench.workloads.real import RealWorkload

    net = build_model("inception_v3", num_classes=10).eval()
    with torch.no_grad():  # eval: no auxiliary head, logits only (torchvision's behaviour)
        out = net(torch.randn(1, 3, 75, 75))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 10)
    # the real workload's probe runs in eval mode: the head is never reached, so not synced
    wl = RealWorkload("inception_v3", rank=0, batch_size=1, num_classes=10, image_size=75)
    assert wl.unused == AUX
    assert len(wl.param_names) == 284


def test_inception_training_pass_at_299_px_returns_both_heads_and_reaches_every_parameter():
    net = build_model("inception_v3", num_classes=10).train()
    out = net(torch.randn(2, 3, 299, 299))  # BatchNorm in training needs 2 samples
    assert out.logits.shape == out.aux_logits.shape == (2, 10)
    (out.logits.sum() + 0.4 * out.aux_logits.sum()).backward()  # torchvision's recipe
    assert all(p.grad is not None for p in net.parameters())


# -- the held-out model: a factory, never registered --------------------------------------

def test_heldout_vit_is_a_factory_not_a_registered_model():
    assert not any("vit" in name for name in MODELS)
    shapes = parameter_shapes(VIT)
    assert _count(shapes) == (2_693_578, 80)
    assert [n for n, _ in shapes][:4] == ["cls_token", "pos_embed", "patch_embed.weight",
                                          "patch_embed.bias"]
    small = parameter_shapes(VIT, kwargs={"depth": 2, "dim": 64, "heads": 4})
    assert _count(small)[1] == 2 * 12 + 8


def test_heldout_vit_trains_a_step_at_32_px_on_cpu():
    from commbench.workloads.real import RealWorkload

    wl = RealWorkload(VIT, rank=0, batch_size=4, image_size=32, lr=0.05)
    assert wl.loss_rule == "cross-entropy" and not wl.unused
    assert wl.input_shape == (3, 32, 32)
    timer, losses = NullTimer(), []
    for _ in range(3):
        announced: list[int] = []
        wl.forward(timer)
        wl.backward(timer, announced.append)
        wl.optimizer_step(timer)
        losses.append(float(wl.loss.detach()))
        assert sorted(announced) == list(range(len(wl.params)))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_heldout_vit_refuses_another_image_size():
    net = build_model(VIT)
    with pytest.raises(ValueError, match="image_size"):
        net(torch.randn(1, 3, 64, 64))
