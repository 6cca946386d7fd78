"""Shrinking a model sharded with FSDP2: gathered once on rank 0 to the CPU, shrunk there and
written as a folder that ``from_pretrained`` loads (``load_shrunk`` where widths differ per
layer), equal to one process's shrunk model.

2 gloo ranks on CPU: a tiny Llama (grouped-query attention) with ``fully_shard`` on each decoder
layer and the root, trained with SGD between the steps of a ``LinearSchedule`` (lean masks), then
:func:`~tensorplay.ao.pruning.structured.shrinking.gathered.save_shrunk`. The oracle is one process
running the same steps on the unsharded model and :func:`~tensorplay.ao.pruning.shrink`: masks equal
bit for bit, the saved weights within 1e-5 (the ranks' gradients are all-reduced sums, in another
order than one process's), the outputs of the loaded folder within 1e-4. A refusal (a group that
does not fit) is raised on every rank, before any folder is written, the sharded model unchanged. A
folder saved from the sharded run with its units masked (its full state gathered and written with
``save_pretrained``) is shrunk later in one process by ``load_masked`` and ``shrink`` to exactly
what the ranks wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

transformers = pytest.importorskip("transformers")

WORLD = 2
STEPS = 4
TOKENS = torch.randint(0, 97, (STEPS, 2, 8), generator=torch.Generator().manual_seed(5))
CASES: dict[str, dict[str, Any]] = {
    "channel": {"structure": "channel"},  # global: widths differ per layer
    "channel-layerwise": {"structure": "channel", "scope": "layerwise"},
    "head": {"structure": "head"},
    "layer": {"structure": "layer", "scope": "layerwise"},
    "budget": {"structure": ("channel", "head"), "target_params": 0.8},
}


def _train_and_prune(name: str, sharded: bool) -> tuple[nn.Module, Any]:
    from tensorplay.ao.pruning.pruner.conductor import Pruner
    from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, LinearSchedule, Schedule
    from tests.core.structure.test_structure_sharded import _llama, _shard

    model = _llama()
    if sharded:
        _shard(model, "llama")
    options = CASES[name]
    schedule: Schedule = LinearSchedule(0.5, end_step=2, frequency=1)
    if "target_params" in options:
        schedule = CubicSchedule(end_step=2, frequency=1)
    pruner = Pruner(model, schedule, masking="inplace", seed=3, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    pruner.attach(optimizer)
    for step in range(STEPS):
        optimizer.zero_grad()
        model(TOKENS[step], labels=TOKENS[step]).loss.backward()
        optimizer.step()
        pruner.step(step)
    return model, pruner


def _masks(model: nn.Module) -> dict[str, Tensor]:
    found = {}
    for name, buffer in model.named_buffers():
        if name.endswith("_mask"):
            full = buffer.full_tensor() if hasattr(buffer, "full_tensor") else buffer
            found[name] = full.detach().clone()
    return found


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def _save_masked(model: nn.Module, folder: Path, rank: int) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)  # rank 0's only
    if rank == 0:
        model.save_pretrained(folder, state_dict=state)
    dist.barrier()


def _worker(rank: int, out: Path) -> None:
    from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    from tensorplay.ao.pruning.structured.shrinking.gathered import save_shrunk

    results: dict[str, Any] = {}
    for name in CASES:
        model, _ = _train_and_prune(name, sharded=True)
        masks = _masks(model)
        before = {key: value.to_local().clone() for key, value in model.state_dict().items()}
        if name == "channel":  # a masked folder, as a sharded run saves its full state
            _save_masked(model, out / "masked", rank)
        report = save_shrunk(model, out / name)
        if name == "channel-layerwise":  # gathered into a bfloat16 copy, written so
            save_shrunk(model, out / "bfloat16", dtype=torch.bfloat16)
        unchanged = all(
            torch.equal(value.to_local(), before[key]) for key, value in model.state_dict().items()
        )
        results[name] = {"masks": masks, "report": str(report), "unchanged": unchanged}
    misfit = UnitGroup("head", "channel", 1000, (Slice("lm_head.weight", 0),))  # 97 rows
    try:
        save_shrunk(model, out / "misfit", groups=[misfit])
        results["refusal"] = "not refused"
    except ValueError as error:
        results["refusal"] = str(error)
    torch.save(results, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_run_shrinks_on_rank_zero_to_the_folder_one_process_would_save(tmp_path):
    from tensorplay.ao.pruning import load_masked, load_shrunk, shrink
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for name in CASES:
        model, _ = _train_and_prune(name, sharded=False)
        masks = _masks(model)
        report = shrink(model)
        llama = transformers.LlamaForCausalLM
        if report.config == "uniform":  # equal widths in every layer: plain loading
            loaded = llama.from_pretrained(tmp_path / name).eval()
        else:
            loaded = load_shrunk(llama, tmp_path / name).eval()
        for rank in ranks:
            got = rank[name]
            assert sorted(got["masks"]) == sorted(masks), name
            assert all(torch.equal(got["masks"][k], m) for k, m in masks.items()), name
            assert got["report"] == str(report), name
            assert got["unchanged"], name  # the sharded model is as it was
        assert report.removed > 0, name
        expected, saved = _state(model), _state(loaded)
        assert sorted(saved) == sorted(expected), name
        for key, value in expected.items():
            assert saved[key].shape == value.shape, (name, key)
            torch.testing.assert_close(saved[key], value, atol=1e-5, rtol=1e-5)
        if name == "channel-layerwise":
            half = _state(llama.from_pretrained(tmp_path / "bfloat16", dtype=torch.bfloat16))
            assert all(value.dtype == torch.bfloat16 for value in half.values())
            for key, value in expected.items():  # one bfloat16 rounding of the float32
                torch.testing.assert_close(half[key].float(), value, atol=1e-2, rtol=1e-2)
        if name == "channel":  # the masked folder, shrunk later in this process
            later = load_masked(llama, tmp_path / "masked")
            assert str(shrink(later)) == str(report)
            for key, value in _state(later).items():
                torch.testing.assert_close(value, saved[key], atol=0, rtol=0)
        tokens = TOKENS[0]
        with torch.no_grad():
            torch.testing.assert_close(
                loaded(tokens).logits, model.eval()(tokens).logits, atol=1e-4, rtol=1e-4
            )
    for rank in ranks:
        assert "lm_head.weight" in rank["refusal"], rank["refusal"]
    assert not (tmp_path / "misfit").exists()
    configs = {name: ranks[0][name]["report"].splitlines()[-1] for name in CASES}
    assert "plain from_pretrained" in configs["channel-layerwise"], configs
