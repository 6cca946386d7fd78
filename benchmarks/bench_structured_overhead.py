"""What structured masks cost per training step, side by side with element masks and dense.

Run (a few minutes on a 2-core machine)::

    python benchmarks/bench_structured_overhead.py            # Llama, hidden 256, 4 layers
    python benchmarks/bench_structured_overhead.py --quick    # hidden 32, 2 layers, a few steps

A small Llama-style model (``LlamaForCausalLM`` from a config, random init; hidden 256, 4
layers, FFN 688, 4 query heads sharing 2 key/value heads, vocabulary 1024) trains with AdamW on
one fixed batch of random tokens (4 x 128), one copy of one initialisation per way:

* **dense**: no pruner, the reference;
* **element-<masking>**: ``Pruner(model, OneShotSchedule(0.5))``: half of every Linear
  weight's entries (the default selection) masked;
* **channel-<masking>**: ``Pruner(model, OneShotSchedule(0.5), structure="channel")``: half of
  the FFN channels masked in the gate, up and down projections;

each in ``masking="reparametrize"`` (the forward recomputes ``mask * orig``) and
``"inplace"`` (lean masks: the attached optimizer re-zeroes the pruned weights after each
step). The pruned ways prune once, at step 0, then every timed step is forward, backward,
``optimizer.step()`` and ``pruner.step()``, as a training loop runs them. The masked weights
stay in the model (nothing is shrunk: :mod:`bench_structured_speed` measures the shrunk model).

The ways take turns (round-robin, the order rotating each round, after a warm-up), on one
torch thread timed by the thread's CPU time (``time.thread_time``: a busy shared machine delays
the run but does not inflate it); printed: the median time per step and the median over rounds
of each round's ratio to its own dense turn. Results go to
``benchmarks/results/structured_overhead.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import counted, in_turns, median_ratios, write_results

RESULTS = Path(__file__).resolve().parent / "results"
# CPU time of this thread: with one torch thread every kernel runs here, and time spent
# waiting for a core that other processes hold (a shared machine) is not counted.
CLOCK = time.thread_time
WAYS: dict[str, dict[str, Any] | None] = {
    "dense": None,
    "element-reparametrize": {"masking": "reparametrize"},
    "element-inplace": {"masking": "inplace"},
    "channel-reparametrize": {"masking": "reparametrize", "structure": "channel"},
    "channel-inplace": {"masking": "inplace", "structure": "channel"},
}


def llama(hidden: int, layers: int, ffn: int, vocab: int) -> nn.Module:
    """A ``LlamaForCausalLM`` of these sizes (4 query heads, 2 key/value heads), seeded."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM(config).train()


class _Run:
    """One way: its model, optimizer and pruner (pruned at step 0)."""

    def __init__(self, options: dict[str, Any] | None, base: nn.Module, tokens: Tensor) -> None:
        self.model = copy.deepcopy(base)
        self.tokens = tokens
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.pruner: Pruner | None = None
        if options is not None:
            self.pruner = Pruner(self.model, OneShotSchedule(0.5), **options)
            if self.pruner.mode.hooks_optimizers:
                self.pruner.attach(self.optimizer)
            self.pruner.step(0)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model(self.tokens, labels=self.tokens).loss.backward()
        self.optimizer.step()
        if self.pruner is not None:
            self.pruner.step()

    def sparsity(self) -> float:
        return 0.0 if self.pruner is None else self.pruner.sparsity()


def measure(
    sizes: dict[str, int], batch: int, length: int, rounds: int, steps: int
) -> dict[str, Any]:
    """Time every way in turns; ratios to the dense turn of the same round."""
    base = llama(sizes["hidden"], sizes["layers"], sizes["ffn"], sizes["vocab"])
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, sizes["vocab"], (batch, length), generator=generator)
    runs = {name: _Run(options, base, tokens) for name, options in WAYS.items()}
    for run in runs.values():
        run.step()  # warm-up
    names = list(runs)
    steps_by_name = {name: run.step for name, run in runs.items()}
    times = in_turns(steps_by_name, rounds, steps, clock=CLOCK)
    ratios = median_ratios(times, "dense")
    return {
        "ways": {
            name: {
                "median_step_ms": 1e3 * statistics.median(times[name]),
                "ratio_to_dense": ratios[name],
                "sparsity": runs[name].sparsity(),
                "masked_tensors": 0
                if runs[name].pruner is None
                else len(runs[name].pruner.targets),  # type: ignore[union-attr]
            }
            for name in names
        },
        "parameters": sum(p.numel() for p in base.parameters()),
    }


# What each way masks, as the table names it.
LABELS = {
    "dense": "none (dense)",
    "element-reparametrize": "single weights, reparametrized",
    "element-inplace": "single weights, lean (inplace)",
    "channel-reparametrize": "FFN channels, reparametrized",
    "channel-inplace": "FFN channels, lean (inplace)",
}


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    config = results["config"]
    lines = [
        f"Llama, hidden {config['hidden']}, {config['layers']} layers, FFN {config['ffn']}, "
        f"vocabulary {config['vocab']} ({results['parameters'] / 1e6:.1f}M parameters), batch "
        f"{config['batch']} x {config['length']} tokens, AdamW; units pruned to 50% once, then "
        f"forward, backward, optimizer and pruner steps; {config['rounds']} rounds of "
        f"{config['steps']} steps, {counted(config['threads'], 'thread')}, CPU time, torch "
        f"{config['torch']}.",
        "",
        "| masks | masked tensors | median step (ms) | vs dense |",
        "|---|---|---|---|",
    ]
    for name, way in results["ways"].items():
        lines.append(
            f"| {LABELS.get(name, name)} | {way['masked_tensors']} | {way['median_step_ms']:.1f} | "
            f"{way['ratio_to_dense']:.3f}x |"
        )
    lines += [
        "",
        "A ratio is the median over rounds of each round's time against its own dense turn; "
        "masked tensors are those the pruner holds a mask for.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, measure, print and save."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=688)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time)")
    parser.add_argument("--quick", action="store_true", help="hidden 32, 2 layers, 2 rounds of 1")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.ffn, args.vocab = 32, 2, 48, 64
        args.length, args.rounds, args.steps = 16, 2, 1
    torch.set_num_threads(args.threads)
    sizes = {"hidden": args.hidden, "layers": args.layers, "ffn": args.ffn, "vocab": args.vocab}
    results = measure(sizes, args.batch, args.length, args.rounds, args.steps)
    results["config"] = {
        **sizes,
        "batch": args.batch,
        "length": args.length,
        "rounds": args.rounds,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    table = markdown(results)
    print(table)
    write_results(args.out, "structured_overhead", results, table + "\n")


if __name__ == "__main__":
    main()
