"""The Hugging Face ``Trainer`` under Accelerate's FSDP2 with ``GradualPruningCallback``, against
one GPU: PASS or FAIL. It needs 2 or more CUDA GPUs (Accelerate runs FSDP on accelerators
only: on CPU it drops the FSDP plugin and trains with DDP, and the callback refuses that).

Run (about a minute)::

    python benchmarks/gpu_hf_trainer_fsdp2.py             # FSDP2 on 2 GPUs against 1
    python benchmarks/gpu_hf_trainer_fsdp2.py --gpus 4    # on 4 GPUs against 1

A tiny Llama (a ``LlamaConfig``: 3 blocks, width 32, grouped-query attention; random init, no
download) trains for 6 optimizer steps on fixed random tokens, in order
(``train_sampling_strategy="sequential"``), twice, each in processes of its own so that
Accelerate's state of one never leaks into the other:

* **one GPU**: ``python``, batch ``4 * gpus``;
* **FSDP2**: ``torchrun`` on ``gpus`` GPUs, ``fsdp=True`` with ``fsdp_config={"version": 2,
  "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}``, batch 4 per GPU: the same global
  batch of the same tokens at every step.

Both with ``GradualPruningCallback(LinearSchedule(0.5, end_step=4, frequency=2),
structure="channel", masking="inplace", distill_weight=1.0)``: channels pruned at steps 2
and 4, the teacher a frozen copy of the model before the first pruning step (under FSDP2 sharded
like it). Checked, each printed PASS or FAIL:

1. under FSDP2 the parameters and the masks are ``DTensor`` s, the masks placed like the weights;
2. the masks and the pruning history equal the one GPU's bit for bit;
3. the trained weights and the logged losses (the distillation term included) equal the one
   GPU's within ``atol=1e-4, rtol=1e-3`` (float32, TF32 off: the sums are grouped differently);
4. ``trainer.save_model()`` under FSDP2 writes a folder that ``from_pretrained`` loads to the
   trained weights exactly (the masks saved beside them, ``*_mask``, are left out by it);
5. ``shrink_at_end=True`` under FSDP2 (the model gathered on the main process) writes
   ``<output_dir>/shrunk``, which loads to the one GPU's trained model shrunk, within the
   tolerance of 3.

The exit status is 0 when all pass, 1 when one fails, 2 when there are too few GPUs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

ATOL, RTOL = 1e-4, 1e-3
BATCH = 4  # per GPU under FSDP2
STEPS = 6
VOCAB = 97


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Fixed random sequences of 16 tokens, each its own language-model label."""

    def __init__(self, count: int = 256) -> None:
        self.ids = torch.randint(0, VOCAB, (count, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def tiny_llama() -> torch.nn.Module:
    """The tests' tiny Llama (``tests/hf_models.py``), seed 0."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU (a collective for a ``DTensor``: every rank calls it)."""
    whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return whole.detach().cpu().clone()


def train(out: Path, role: str, gpus: int) -> None:
    """One run (``role``: ``"single"`` or ``"fsdp2"``); rank zero writes ``<out>/<role>.pt``."""
    import transformers

    from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sharded = role == "fsdp2"
    fsdp: dict[str, Any] = {}
    if sharded:
        layers = ["LlamaDecoderLayer"]
        fsdp = {
            "fsdp": True,
            "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": layers},
        }
    args = transformers.TrainingArguments(
        output_dir=str(out / role), max_steps=STEPS, learning_rate=1e-3, seed=0,
        per_device_train_batch_size=BATCH if sharded else BATCH * gpus,
        train_sampling_strategy="sequential", logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, **fsdp,
    )  # fmt: skip
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4, frequency=2), structure="channel", masking="inplace",
        distill_weight=1.0, shrink_at_end=sharded, verbose=False,
    )  # fmt: skip
    model = tiny_llama()
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=[pruning]
    )
    trainer.train()
    model = pruning.pruner.model  # the model the Trainer trained (sharded under FSDP2)
    masks, placed_alike = {}, True
    for name, buffer in model.named_buffers():
        if name.endswith("_mask"):
            weight = model.get_parameter(name.removesuffix("_mask"))
            placed_alike &= getattr(buffer, "placements", None) == getattr(
                weight, "placements", None
            )
            masks[name] = full(buffer)
    found = {
        "kinds": sorted({type(p).__name__ for p in model.parameters()}),
        "mask_kinds": sorted({type(b).__name__ for n, b in model.named_buffers() if "_mask" in n}),
        "placed_alike": placed_alike,
        "masks": masks,
        "weights": {name: full(param) for name, param in model.named_parameters()},
        "history": pruning.pruner.history,
        # The loss the Trainer logs, averaged over the ranks, holds the distillation term (the
        # callback's `pruning/distill_loss` is this rank's alone).
        "logs": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    }
    trainer.save_model(str(out / f"saved-{role}"))
    if trainer.is_world_process_zero():
        torch.save(found, out / f"{role}.pt")


def compare(out: Path) -> bool:
    """Print each check PASS or FAIL; whether all passed."""
    import transformers

    single = torch.load(out / "single.pt", weights_only=False)
    sharded = torch.load(out / "fsdp2.pt", weights_only=False)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a, b, atol=ATOL, rtol=RTOL)

    loaded = transformers.LlamaForCausalLM.from_pretrained(str(out / "saved-fsdp2"))
    saved = {name: param.detach() for name, param in loaded.named_parameters()}
    checks = {
        "1. DTensor parameters and masks, masks placed like the weights": (
            sharded["kinds"] == ["DTensor"]
            and sharded["mask_kinds"] == ["DTensor"]
            and sharded["placed_alike"]
        ),
        "2. masks and history equal one GPU's bit for bit": (
            len(single["masks"]) > 0
            and sorted(single["masks"]) == sorted(sharded["masks"])
            and all(torch.equal(m, sharded["masks"][n]) for n, m in single["masks"].items())
            and single["history"] == sharded["history"]
            and len(single["history"]) > 0
        ),
        "3. weights and losses (distillation term included) within tolerance": (
            sorted(single["weights"]) == sorted(sharded["weights"])
            and all(close(w, sharded["weights"][n]) for n, w in single["weights"].items())
            and len(single["logs"]) == len(sharded["logs"]) == STEPS
            and close(torch.tensor(single["logs"]), torch.tensor(sharded["logs"]))
        ),
        "4. save_model under FSDP2 loads to the trained weights": (
            sorted(saved) == sorted(sharded["weights"])
            and all(torch.equal(w, sharded["weights"][n]) for n, w in saved.items())
        ),
        "5. shrink_at_end under FSDP2 writes the one GPU's model, shrunk": _shrunk_alike(
            single, out / "fsdp2" / "shrunk", close
        ),
    }
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    print(f"history: one GPU {single['history']}, FSDP2 {sharded['history']}")
    return all(checks.values())


def _shrunk_alike(single: dict[str, Any], folder: Path, close: Any) -> bool:
    """Whether ``folder`` (written by ``shrink_at_end`` under FSDP2) holds the one GPU's
    trained model shrunk (its weights and masks installed in a fresh model, then shrunk)."""
    import transformers

    from tensorplay.ao.pruning import install_saved_masks, load_shrunk, shrink

    model = tiny_llama()
    model.load_state_dict(single["weights"], strict=False)
    install_saved_masks(model, single["masks"])
    shrink(model)
    expected = model.state_dict()
    written = load_shrunk(transformers.LlamaForCausalLM, folder).state_dict()
    return sorted(written) == sorted(expected) and all(
        close(value.cpu(), written[key]) for key, value in expected.items()
    )


def run(command: list[str], env: dict[str, str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, env=env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--role", choices=("single", "fsdp2"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role is not None:  # a run, in a process of its own
        train(options.out, options.role, options.gpus)
        return 0
    if torch.cuda.device_count() < max(2, options.gpus):
        print(f"SKIP: needs {max(2, options.gpus)} CUDA GPUs, found {torch.cuda.device_count()}")
        return 2
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        me = [str(Path(__file__).resolve()), "--gpus", str(options.gpus), "--out", folder]
        run([sys.executable, *me, "--role", "single"], {**env, "CUDA_VISIBLE_DEVICES": "0"})
        run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc_per_node={options.gpus}", *me, "--role", "fsdp2"],
            env,
        )  # fmt: skip
        passed = compare(out)
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
