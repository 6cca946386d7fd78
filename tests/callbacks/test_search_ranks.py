"""A searched run under ``torch.distributed``: every rank must choose one mix and the same
layers, or the build is refused on every rank before anything changes (gloo, two CPU ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.core.gloo import spawn_gloo

pytest.importorskip("transformers")


def _build(rank: int, out: Path, quiet_layer: int) -> None:
    """Build a searched session on a tiny Llama whose block ``quiet_layer`` barely changes the
    stream (the one a layer search removes), and write what happened."""
    from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
    from tensorplay.callbacks.core.lifecycle import PruningSession, split_arguments
    from tests.hf_models import tiny_llama
    from tests.model_state import unchanged

    model = tiny_llama()
    with torch.no_grad():
        for parameter in model.model.layers[quiet_layer].parameters():
            parameter.mul_(1e-3)
    check = unchanged(model)
    generator = torch.Generator().manual_seed(5)
    batches = [{"input_ids": torch.randint(3, 97, (2, 16), generator=generator)}]
    config, options = split_arguments({
        "schedule": LinearSchedule(end_step=2), "structure": ("layer", "channel"),
        "target_params": 0.8, "search": True, "search_batches": batches,
        "search_allocation": {"layer": 1.0}, "verbose": False,
    })  # fmt: skip
    session = PruningSession(config, options, name="Adapter", built_when="")
    try:
        pruner = session.build(model)
    except RuntimeError as refused:
        check()
        found = {"refused": str(refused)}
    else:
        found = {"dropped": list(getattr(pruner, "dropped", []))}
    (out / f"{rank}.json").write_text(json.dumps(found))


def _same_worker(rank: int, out: Path) -> None:
    _build(rank, out, quiet_layer=1)


def _differing_worker(rank: int, out: Path) -> None:
    _build(rank, out, quiet_layer=2 * rank)


def _results(out: Path) -> list[dict[str, object]]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]


def test_ranks_that_choose_alike_build_alike(tmp_path: Path) -> None:
    spawn_gloo(_same_worker, 2, tmp_path)
    assert _results(tmp_path) == [{"dropped": ["model.layers.1"]}] * 2


def test_ranks_that_choose_differently_are_refused_on_every_rank_unchanged(
    tmp_path: Path,
) -> None:
    spawn_gloo(_differing_worker, 2, tmp_path)
    for found in _results(tmp_path):
        message = str(found["refused"])
        assert "expected every rank to choose one mix" in message
        assert "model.layers.0" in message and "model.layers.2" in message
        assert "seed_everything" in message
