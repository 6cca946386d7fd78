"""What a checkpoint of ``GradualPruningCallback`` costs on disk, against the same dense run.

Run (about a minute on a 2-core machine; needs ``transformers`` and ``accelerate``)::

    python benchmarks/bench_trainer_checkpoint_size.py            # GPT-2, 4 blocks 256 wide
    python benchmarks/bench_trainer_checkpoint_size.py --tiny     # 1 block 32 wide, for the tests

``Trainer.train`` of a GPT-2 (``--layers`` blocks ``--width`` wide, 3.2M parameters at the
defaults) for 8 optimizer steps, a checkpoint written after the last, three ways: **dense** (no
callback), and ``GradualPruningCallback`` pruning 80% of the projections and the tied embedding
at step 4 with the **reparametrize** and the **inplace** masks. Measured in each checkpoint
folder: ``model.safetensors`` (the model in the permanent form: what ``from_pretrained`` loads),
``trainer_state.json`` (where the callback keeps the pruner's state and the kept zeros),
``optimizer.pt``, and the whole folder. For comparison, the bytes the model's tensors would take
in the training form (``<name>_orig`` and ``<name>_mask``, or the lean bool masks), which
checkpoints held before.

Then the record of kept zeros: ``N`` kept weights of the pruned model are set to exactly zero by
hand (as a zero-initialised weight that is never trained would be), and the size of that record
in ``trainer_state.json`` is measured, per kept zero. Results go to
``benchmarks/results/trainer_checkpoint_size.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import write_results

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = ("dense", "reparametrize", "inplace")
VOCAB = 256
STEPS = 8


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random byte sequences, each its own language-model label."""

    def __init__(self, count: int, length: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def gpt2(width: int, layers: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_embd=width, n_head=max(1, width // 64), vocab_size=VOCAB,
        n_positions=128, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).train()


def training_form_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's tensors as the training form holds them (each storage once)."""
    seen: set[int] = set()
    total = 0
    for tensor in model.state_dict(keep_vars=True).values():
        if tensor.untyped_storage().data_ptr() not in seen:
            seen.add(tensor.untyped_storage().data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def run(way: str, width: int, layers: int, out: Path) -> tuple[dict[str, Any], Any]:
    from transformers import Trainer, TrainingArguments

    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    model = gpt2(width, layers)
    callbacks = []
    if way != "dense":
        callbacks = [
            GradualPruningCallback(OneShotSchedule(0.8, step=4), masking=way, verbose=False)
        ]
    args = TrainingArguments(
        output_dir=str(out / way), max_steps=STEPS, per_device_train_batch_size=4,
        use_cpu=True, report_to="none", save_strategy="steps", save_steps=STEPS,
        disable_tqdm=True, logging_steps=STEPS, dataloader_num_workers=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(32, 64), callbacks=callbacks)
        trainer.train()
    folder = out / way / f"checkpoint-{STEPS}"
    row = {
        "model_safetensors": (folder / "model.safetensors").stat().st_size,
        "trainer_state_json": (folder / "trainer_state.json").stat().st_size,
        "optimizer_pt": (folder / "optimizer.pt").stat().st_size,
        "folder": sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()),
        "training_form": training_form_bytes(model),
    }
    if callbacks:
        row["sparsity"] = callbacks[0].pruner.sparsity()
    return row, (callbacks[0] if callbacks else None)


def kept_zero_cost(callback: Any, counts: list[int]) -> dict[str, float]:
    """Bytes of the kept-zeros record in trainer_state.json per kept zero, for each count."""
    pruner = callback.pruner
    out: dict[str, float] = {}
    base = len(json.dumps(callback.state()))
    kept = []
    for module, name in pruner.pairs:
        values = getattr(module, name + "_orig", getattr(module, name))
        mask = getattr(module, name + "_mask") != 0
        kept.extend((values, index) for index in mask.reshape(-1).nonzero().reshape(-1).tolist())
    done = 0
    with torch.no_grad():
        for count in counts:
            for values, index in kept[done:count]:
                values.view(-1)[index] = 0.0
            done = count
            extra = len(json.dumps(callback.state())) - base
            out[str(count)] = extra / count
    return out


def measure(width: int, layers: int, kept: list[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as directory:
        for way in WAYS:
            rows[way], callback = run(way, width, layers, Path(directory))
            if way == "reparametrize":
                rows["kept_zero_bytes"] = kept_zero_cost(callback, kept)
    return {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "width": width,
        "layers": layers,
        "parameters": sum(p.numel() for p in gpt2(width, layers).parameters()),
        "ways": {way: rows[way] for way in WAYS},
        "kept_zero_bytes": rows["kept_zero_bytes"],
    }


def _kb(value: float) -> str:
    return f"{value / 1024:,.1f} KiB"


def markdown(results: dict[str, Any]) -> str:
    dense = results["ways"]["dense"]
    lines = [
        "| masking | model.safetensors | training form (before) | trainer_state.json "
        "| optimizer.pt | folder | folder / dense |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for way, row in results["ways"].items():
        lines.append(
            f"| {way} | {_kb(row['model_safetensors'])} | {_kb(row['training_form'])} "
            f"| {_kb(row['trainer_state_json'])} | {_kb(row['optimizer_pt'])} "
            f"| {_kb(row['folder'])} | {row['folder'] / dense['folder']:.3f}x |"
        )
    kept = ", ".join(
        f"{size:.1f} bytes each with {int(count):,}"
        for count, size in results["kept_zero_bytes"].items()
    )
    caption = (
        f"GPT-2 of {results['layers']} blocks {results['width']} wide, "
        f"{results['parameters']:,} parameters, fp32; 80% of the projections and the tied "
        f"embedding pruned at step 4, the checkpoint written after step {STEPS}. Kept weights "
        f"that are exactly zero, listed in trainer_state.json: {kept}."
    )
    return "\n".join(lines) + "\n\n" + caption + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measure and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="1 block 32 wide")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    width, layers, kept = (32, 1, [10, 100]) if options.tiny else (256, 4, [1000, 100000])
    results = measure(width, layers, kept)
    table = markdown(results)
    write_results(options.out, "trainer_checkpoint_size", results, table)
    print(table)


if __name__ == "__main__":
    main()
