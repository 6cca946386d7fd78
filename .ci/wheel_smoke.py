"""Smoke test of an installed (not editable) tensorplay: ``python wheel_smoke.py CHECKOUT``.

Run it from outside the checkout with the interpreter of the virtual environment the wheel went
into. It checks that tensorplay comes from that environment, that it holds every module of the
checkout's source tree (each one importing), that pruning counts are exact in both masking
modes and with a gradient importance, that both training-framework callbacks import and the
Hugging Face one prunes inside ``Trainer.train``, and that the ``tensorplay-report`` console
script reads a saved state_dict.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Literal

import torch
from torch import nn

import tensorplay
import tensorplay.ao.pruning as prune
from tensorplay.ao.pruning import CubicSchedule, Pruner

SOURCES = {"tensorplay": "tensorplay", "callbacks": "tensorplay.callbacks"}


def source_modules(checkout: Path) -> set[str]:
    """The dotted names of every module of the checkout's source roots, as installed."""
    names = set()
    for folder, package in SOURCES.items():
        for path in (checkout / folder).rglob("*.py"):
            parts = path.relative_to(checkout / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join((package, *parts)))
    return names


def installed_modules() -> set[str]:
    """Every module of the installed ``tensorplay``, each imported."""

    def fail(name: str) -> None:
        raise ImportError(f"cannot import {name}")

    names = {"tensorplay"}
    for module in pkgutil.walk_packages(tensorplay.__path__, "tensorplay.", onerror=fail):
        importlib.import_module(module.name)
        names.add(module.name)
    return names


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def zero_fraction(net: nn.Module) -> float:
    """Zero weights over all weights of the linear layers."""
    weights = [layer.weight for layer in net.modules() if isinstance(layer, nn.Linear)]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


def check_global_unstructured() -> None:
    net = model()
    pairs = [(net[0], "weight"), (net[2], "weight")]
    prune.global_unstructured(pairs, prune.L1Unstructured, amount=0.3)
    pruned = sum(int(layer.get_buffer("weight_mask").eq(0).sum()) for layer, _ in pairs)
    assert pruned == round(0.3 * (16 * 32 + 32 * 4)), pruned


def check_pruner(masking: Literal["reparametrize", "inplace"], steps: int = 6) -> None:
    """A few optimizer steps under a cubic schedule; the count is exact at every step."""
    net = model()
    pruner = Pruner(net, CubicSchedule(0.8, end_step=4, frequency=2), masking=masking)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if masking == "inplace":
        pruner.attach(optimizer)
    for _ in range(steps):
        pruner.step()
        optimizer.zero_grad()
        net(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        assert pruner.sparsity() == zero_fraction(net), (masking, pruner.sparsity())
    assert pruner.pruned_count() == round(0.8 * pruner.total_count()), masking


def check_movement() -> None:
    """Movement scores from an accumulated gradient: the lowest ``-w * g`` go first."""
    net = model()
    pruner = Pruner(net, CubicSchedule(0.5, end_step=1, frequency=1), importance="movement")
    pruner.step(0)
    net(torch.randn(8, 16)).square().mean().backward()
    assert pruner.accumulate() == 2
    assert pruner.step(1) == round(0.5 * pruner.total_count())


def check_trainer_callback(folder: Path) -> None:
    """A tiny GPT-2 (random init, random tokens) pruned to 50% in 4 Trainer steps."""
    import transformers

    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    net = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (16, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    callback = GradualPruningCallback(CubicSchedule(0.5, end_step=4, frequency=2), verbose=False)
    args = transformers.TrainingArguments(
        str(folder / "trainer"), max_steps=4, per_device_train_batch_size=4, use_cpu=True,
        report_to="none", save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    transformers.Trainer(model=net, args=args, train_dataset=data, callbacks=[callback]).train()
    pruner = callback.pruner
    assert pruner.pruned_count() == round(0.5 * pruner.total_count()), pruner.pruned_count()


def check_report(folder: Path) -> None:
    net = model()
    prune.global_unstructured([(net[0], "weight")], prune.L1Unstructured, amount=0.5)
    path = folder / "pruned.pt"
    torch.save(net.state_dict(), path)
    report = Path(sys.executable).with_name("tensorplay-report")
    out = subprocess.run([str(report), str(path)], check=True, capture_output=True, text=True)
    assert "global sparsity 50.00%: 256 of 512 units pruned" in out.stdout, out.stdout


def main(checkout: Path) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    assert Path(tensorplay.__file__).is_relative_to(site), f"{tensorplay.__file__} not in {site}"
    missing = source_modules(checkout) - installed_modules()
    assert not missing, f"not installed: {sorted(missing)}"
    check_global_unstructured()
    check_pruner("reparametrize")
    check_pruner("inplace")
    from tensorplay.callbacks import GradualPruning

    assert GradualPruning.__module__.startswith("tensorplay.callbacks")
    check_movement()
    with tempfile.TemporaryDirectory() as folder:
        check_trainer_callback(Path(folder))
        check_report(Path(folder))
    print(f"wheel smoke test passed: {tensorplay.__file__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
