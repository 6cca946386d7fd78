"""A Lightning run under ``ModelParallelStrategy`` (FSDP2, two CPU ranks) with channels,
distillation and ``shrink_at_end=True`` ends with a shrunk folder that plain ``from_pretrained``
loads, equal to the one a single-process run writes.

A tiny Llama (grouped-query attention) inside a ``LightningModule``, sharded per decoder layer
in ``configure_model``; the same global batch of 8 sequences per step (4 per rank, or 8 in one
process), momentum SGD; ``structure="channel"`` with ``scope="layerwise"`` (equal widths in
every layer, so the config describes the shrunk model), ``distill_weight=1.0`` (a teacher sharded
like the student, or a dense copy in one process). The masks at the end of fit are compared bit
for bit, the saved weights within 1e-5 (the ranks' gradients are all-reduced means, added in
another order than one process's), the loaded models' logits within 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.fsdp_helpers import full_state, model_parallel_trainer, run_ranks

transformers = pytest.importorskip("transformers")

SEQUENCES = 24  # 3 optimizer steps per epoch, at 8 sequences a step
GLOBAL_BATCH = 8


class TinyLlamaModule(pl.LightningModule):
    """A tiny ``LlamaForCausalLM`` trained on fixed random tokens, in a fixed order; sharded
    per decoder layer and at its root in ``configure_model`` when a device mesh is given."""

    def __init__(self, world_size: int = 1) -> None:
        super().__init__()
        from tests.hf_models import tiny_llama

        self.model = tiny_llama()
        self.world_size = world_size

    def configure_model(self) -> None:
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(input_ids=tokens).logits  # type: ignore[no-any-return]

    def training_step(self, batch: tuple[Tensor], batch_idx: int) -> Tensor:
        (tokens,) = batch
        logits = self(tokens)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        generator = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, 97, (SEQUENCES, 8), generator=generator)
        # Rank r takes the r-th part of every global batch (the distributed sampler is off).
        per_rank = GLOBAL_BATCH // self.world_size
        parts = tokens.view(-1, self.world_size, per_rank, 8)[:, self.global_rank]
        return DataLoader(TensorDataset(parts.reshape(-1, 8)), batch_size=per_rank)


class MaskRecorder(Callback):
    """The full masks when fit ends, before ``GradualPruning`` (after it in the list) shrinks."""

    def __init__(self) -> None:
        self.masks: dict[str, Tensor] = {}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = full_state(pl_module)
        self.masks = {name: value for name, value in state.items() if name.endswith("_mask")}


def _callback(shrunk_dir: Path | None) -> GradualPruning:
    return GradualPruning(
        LinearSchedule(0.5, start_step=1, end_step=3, frequency=1),
        structure="channel",
        scope="layerwise",
        masking="inplace",
        distill_weight=1.0,
        shrink_at_end=True,
        shrunk_dir=None if shrunk_dir is None else str(shrunk_dir),
        verbose=False,
    )


def _worker(rank: int, world_size: int, out: Path) -> None:
    recorder, callback = MaskRecorder(), _callback(None)  # the default folder
    trainer = model_parallel_trainer(
        world_size,
        max_epochs=2,
        callbacks=[recorder, callback],
        default_root_dir=str(out),
        use_distributed_sampler=False,
    )
    trainer.fit(TinyLlamaModule(world_size))
    shrunk = callback.shrunk_model
    torch.save(
        {
            "masks": recorder.masks,
            "history": list(callback.pruner.history),
            "report": str(callback.shrink_report),
            "shrunk_on_cpu": None if shrunk is None else next(shrunk.parameters()).device.type,
            "sharded_after": type(next(trainer.lightning_module.parameters())).__name__,
        },
        out / f"rank{rank}.pt",
    )


def _one_process(out: Path) -> tuple[MaskRecorder, GradualPruning]:
    recorder, callback = MaskRecorder(), _callback(out)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        callbacks=[recorder, callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
    )
    trainer.fit(TinyLlamaModule())
    return recorder, callback


def _weights(folder: Path) -> tuple[nn.Module, dict[str, Tensor]]:
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    return model, {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.distributed
def test_a_run_under_fsdp2_distilled_and_shrunk_at_end_writes_what_one_process_writes(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recorder, callback = _one_process(tmp_path / "one")
    finally:
        torch.set_num_threads(threads)
    history = list(callback.pruner.history)
    assert [pruned for _, _, pruned in history if pruned] and recorder.masks
    for state in ranks:
        assert state["history"] == history
        assert sorted(state["masks"]) == sorted(recorder.masks)
        for name, mask in recorder.masks.items():
            assert torch.equal(state["masks"][name], mask), name
        assert state["report"] == str(callback.shrink_report)
        assert state["sharded_after"] == "DTensor"  # the trained module stays sharded
    assert ranks[0]["shrunk_on_cpu"] == "cpu" and ranks[1]["shrunk_on_cpu"] is None
    assert "plain from_pretrained loads" in ranks[0]["report"]
    sharded, saved = _weights(tmp_path / "shrunk")  # the default: <default_root_dir>/shrunk
    single, expected = _weights(tmp_path / "one")
    assert sharded.config.intermediate_size < TinyLlamaModule().model.config.intermediate_size
    assert sharded.config.intermediate_size == single.config.intermediate_size
    assert sorted(saved) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(saved[key], value, atol=1e-5, rtol=1e-5)
    tokens = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            sharded(tokens).logits, single(tokens).logits, atol=1e-4, rtol=1e-4
        )


class StateRecorder(Callback):
    """The full state (weights and masks) when fit ends, before ``GradualPruning`` shrinks."""

    def __init__(self) -> None:
        self.state: dict[str, Tensor] = {}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.state = full_state(pl_module)


def _plain_worker(rank: int, world_size: int, out: Path) -> None:
    from tests.callbacks.fsdp_helpers import ShardedTiny
    from tests.callbacks.test_pruning_fsdp_structure import EXAMPLE, SCHEDULE

    recorder = StateRecorder()
    callback = GradualPruning(
        SCHEDULE,
        structure="channel",
        masking="inplace",
        example_inputs=EXAMPLE,
        shrink_at_end=True,
        shrunk_dir=str(out / "plain"),
        verbose=False,
    )
    trainer = model_parallel_trainer(world_size, max_epochs=2, callbacks=[recorder, callback])
    trainer.fit(ShardedTiny())
    trainer.save_checkpoint(out / "masked.ckpt")  # the sharded module: masked, not shrunk
    torch.save(recorder.state, out / f"plain-rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_plain_module_under_fsdp2_is_written_shrunk_and_its_checkpoint_shrinks_later(tmp_path):
    from tests.callbacks.fsdp_helpers import ShardedTiny
    from tests.callbacks.test_pruning_fsdp_structure import EXAMPLE

    run_ranks(_plain_worker, 2, tmp_path)
    state = torch.load(tmp_path / "plain-rank0.pt", weights_only=True)
    masked = ShardedTiny()
    with torch.no_grad():
        for name, param in masked.named_parameters():
            param.copy_(state[name] * state.get(f"{name}_mask", torch.ones((), dtype=torch.bool)))
    shrunk = torch.load(tmp_path / "plain" / "model.pt", weights_only=False)
    kept = int(state["net.0.weight_mask"].any(1).sum())
    assert shrunk.net[0].out_features == kept < masked.net[0].out_features
    inputs = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(shrunk(inputs), masked(inputs), atol=1e-6, rtol=1e-6)
    # The distributed checkpoint, shrunk later in one process: converted, masks installed.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tensorplay.ao.pruning import install_saved_masks, shrink

    dcp_to_torch_save(tmp_path / "masked.ckpt", tmp_path / "masked.pt")
    saved = torch.load(tmp_path / "masked.pt", weights_only=False)["state_dict"]
    later = ShardedTiny()
    later.load_state_dict({k: v for k, v in saved.items() if not k.endswith("_mask")})
    assert install_saved_masks(later, saved) == 3
    shrink(later, example_inputs=EXAMPLE)
    assert later.net[0].out_features == kept
    with torch.no_grad():
        torch.testing.assert_close(later(inputs), shrunk(inputs), atol=0, rtol=0)
