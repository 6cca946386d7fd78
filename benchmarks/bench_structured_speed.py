"""Structured pruning's pay-off: a 100M-parameter Llama dense against shrunk, side by side.

Run (about 15 minutes on a 2-core machine, one thread, under load)::

    python benchmarks/bench_structured_speed.py                  # the 100M Llama, 3 rounds
    python benchmarks/bench_structured_speed.py --repeats 5      # steadier medians
    python benchmarks/bench_structured_speed.py --tiny           # a tiny Llama, for the tests
    python benchmarks/bench_structured_speed.py --plot           # the figure, from the JSON

The model is a Llama built from its config (random init, float32): hidden 768, 12 layers, 12
query heads sharing 4 key/value heads (grouped-query attention, head_dim 64), FFN intermediate
2048, vocabulary 32000 with the LM head tied to the embedding (as small Llama-style models
ship): 100.1M parameters, of which 75.5M in the 12 blocks. It is shrunk seven ways, each a copy
of the same dense model:

* **FFN 25/50/75%**: that fraction of every layer's FFN channels;
* **heads 25/50%**: that fraction of every layer's key/value heads, each with its 3 query heads;
* **layers 25%**: 3 of the 12 blocks;
* **floor**: every layer down to one FFN channel and one key/value head (a group keeps one
  unit): what removing channels and heads cannot take away (the LM head, the norms, each
  layer's fixed work per forward).

Pruning is one-shot by magnitude per unit: a unit's score is
:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.unit_scores` of ``|w|`` (the root
mean square of its weights), the lowest-scoring units of each group are masked with
:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.expand_keep` (every layer keeps the
same width;
layers: the lowest-scoring blocks of the model), and
:func:`~tensorplay.ao.pruning.shrink` removes them. Measured for each model:

* **prefill**: one forward over ``4 x 256`` tokens (the prompt pass of ``generate``: the KV
  cache filled, the logits of the last position only), under ``torch.no_grad()``;
* **decoding**: greedy ``generate`` of 64 new tokens at batch 1 after a 16-token prompt, with the
  KV cache: new tokens per second;
* **parameters** (the tied embedding once) and the **file size** of ``save_pretrained``
  (``model.safetensors``);
* **loads**: a fresh process that imports ``transformers`` and not tensorplay loads each saved
  folder with plain ``AutoModelForCausalLM.from_pretrained``; its logits are compared with the
  shrunk model's, and the shrunk model's with the masked model's it came from.

After one warm-up of each model, every shrunk model is timed right beside a turn of the dense
model (dense first in even rounds, second in odd ones; the shrunk models' order rotating each
round); a speed-up is the median over the rounds of these pairs' ratios (load on a shared
machine drifts within a minute more than between two neighbouring calls). Torch runs
``--threads`` threads (1 by default: on a machine shared with other work, a thread per core
makes every operation wait for whichever thread the system has descheduled; at a load average
of 11 on 2 cores two threads ran this prefill 2x and decoding 3x slower than one). The
**expected** speed-ups say what the time would be if it followed the parameters: prefill is
matrix products over every position, so it should follow the parameters in the blocks (the
embedding is a lookup and the tied LM head runs on one position); decoding at batch 1 reads
every weight once per token, the LM head included, so it should follow all parameters.

Results go to ``benchmarks/results/structured_speed.json`` and ``.md``; ``--plot`` draws
``docs/figures/structured_speed.png`` from that JSON (latency against parameters removed),
measuring nothing.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import counted, machine, other_work, run_python, write_results
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "structured_speed"
# (label, kind, fraction of units removed): the configurations.
CONFIGS = (
    ("FFN 25%", "channel", 0.25),
    ("FFN 50%", "channel", 0.50),
    ("FFN 75%", "channel", 0.75),
    ("heads 25%", "head", 0.25),
    ("heads 50%", "head", 0.50),
    ("layers 25%", "layer", 0.25),
)
# What width pruning cannot remove: every layer down to one FFN channel and one key/value head
# (its query heads) of zeros, the LM head, norms and the per-layer work of each forward.
FLOOR = "floor"
FLOOR_UNITS = (("channel", 1.0), ("head", 1.0))
# Shrunk logits are the masked ones up to float rounding; a loaded copy's are the shrunk ones.
ATOL = 1e-4


class Size(NamedTuple):
    """The model and the workload."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int  # prefill batch
    tokens: int  # prefill tokens per sequence
    prompt: int  # decoding prompt (batch 1)
    new_tokens: int  # decoding: greedy tokens generated

    def config(self) -> Any:
        import transformers

        return transformers.LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            tie_word_embeddings=True,
            max_position_embeddings=max(self.tokens, self.prompt + self.new_tokens),
            # No id of a generated token stops greedy decoding early.
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
        )


FULL = Size(768, 12, 12, 4, 2048, 32000, batch=4, tokens=256, prompt=16, new_tokens=64)
# Four layers and four key/value heads: 25% of each is a whole unit.
TINY = Size(64, 4, 8, 4, 128, 512, batch=2, tokens=16, prompt=4, new_tokens=4)


def build_llama(size: Size) -> Any:
    """The dense Llama of ``size``, random init (seed 0), in eval mode."""
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(size.config()).eval()


def prune_by_magnitude(
    model: nn.Module, kind: str, fraction: float, example_inputs: Tensor | None = None
) -> list[Any]:
    """Mask ``fraction`` of the units of ``kind`` by magnitude, in place; return the groups
    (``example_inputs``: for tracing a plain model).

    Channels and heads: in every group, the ``round(fraction * size)`` units of lowest
    :func:`unit_scores` of ``|w|`` (uniform widths). Layers: the ``round(fraction * blocks)``
    blocks of lowest score.
    """
    from tensorplay.ao.pruning import DependencyGraph
    from tensorplay.ao.pruning.structured.dependency.unit_groups import (
        expand_keep,
        shapes_of,
        unit_scores,
    )

    groups = DependencyGraph(model, example_inputs).groups(kind)
    shapes = shapes_of(model)

    def scores(group: Any) -> Tensor:
        magnitudes = {name: model.get_parameter(name).abs() for name in group.scored_parameters()}
        return unit_scores(group, magnitudes)

    if kind == "layer":
        block_scores = torch.cat([scores(group) for group in groups])
        lowest = torch.argsort(block_scores, stable=True)[: round(fraction * len(groups))].tolist()
        keeps = [torch.tensor([index not in lowest]) for index in range(len(groups))]
    else:
        keeps = []
        for group in groups:
            keep = torch.ones(group.size, dtype=torch.bool)
            keep[torch.argsort(scores(group), stable=True)[: round(fraction * group.size)]] = False
            keeps.append(keep)
    with torch.no_grad():
        for group, keep in zip(groups, keeps, strict=True):
            for name, mask in expand_keep(group, keep, shapes).items():
                model.get_parameter(name).mul_(mask)
    return groups


def shrunk_copy(
    dense: nn.Module, units: Sequence[tuple[str, float]], probe: Tensor
) -> dict[str, Any]:
    """A copy of ``dense`` pruned by magnitude (each ``(kind, fraction)`` of ``units``) and
    shrunk, with how far its logits are from the masked model's."""
    from tensorplay.ao.pruning import shrink

    model = copy.deepcopy(dense)
    groups = [g for kind, fraction in units for g in prune_by_magnitude(model, kind, fraction)]
    with torch.no_grad():
        masked = model(probe).logits
        report = shrink(model, groups=groups)
        difference = (model(probe).logits - masked).abs().max().item()
    return {"model": model, "report": report, "masked_difference": difference}


def block_parameters(model: nn.Module) -> int:
    """Parameters in the decoder blocks (not the embedding, final norm or tied LM head)."""
    return sum(p.numel() for p in model.model.layers.parameters())


def parameters(model: nn.Module) -> int:
    """Parameters, each tied tensor once."""
    return sum(p.numel() for p in model.parameters())


def save(model: nn.Module, folder: Path) -> int:
    """``save_pretrained`` into ``folder``; the bytes of its ``model.safetensors``."""
    model.save_pretrained(folder)
    return (folder / "model.safetensors").stat().st_size


# Run by a fresh interpreter: transformers alone loads each folder (tensorplay never imported);
# a folder it refuses gets the error's text instead of logits.
_LOADER = """
import sys, torch, transformers
torch.set_num_threads(int(sys.argv[1]))
probe = torch.load(sys.argv[2])
loaded = {}
for folder in sys.argv[4:]:
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    except Exception as error:
        loaded[folder] = f"{type(error).__name__}: {error}"[:2000]
        continue
    with torch.no_grad():
        loaded[folder] = model(probe).logits
torch.save(loaded, sys.argv[3])
assert "tensorplay" not in sys.modules, "the loader imported tensorplay"
"""


def load_in_fresh_process(
    folders: Sequence[Path], probe: Tensor, work: Path
) -> dict[str, Tensor | str]:
    """Each folder's logits on ``probe`` after plain ``from_pretrained`` in a new process, or
    the text of the error it raised."""
    torch.save(probe, work / "probe.pt")
    run_python(
        "-c",
        _LOADER,
        str(torch.get_num_threads()),
        str(work / "probe.pt"),
        str(work / "logits.pt"),
        *map(str, folders),
    )
    loaded: dict[str, Tensor | str] = torch.load(work / "logits.pt")
    return loaded


def check_loading(
    models: dict[str, Any], folders: dict[str, Path], probe: Tensor, work: Path
) -> dict[str, dict[str, Any]]:
    """How each saved folder loads: plain ``from_pretrained`` in a fresh process, or else
    (widths the config's own keys cannot express) tensorplay's ``load_shrunk``; the largest
    difference of its logits from the model's."""
    import transformers

    from tensorplay.ao.pruning import load_shrunk

    plain = load_in_fresh_process(list(folders.values()), probe, work)
    checks = {}
    with torch.no_grad():
        for name, model in models.items():
            logits, error = plain[str(folders[name])], None
            how = "from_pretrained"
            if isinstance(logits, str):
                error = logits
                how = "load_shrunk"
                logits = load_shrunk(transformers.AutoModelForCausalLM, folders[name])(probe).logits
            difference = (logits - model(probe).logits).abs().max().item()
            checks[name] = {
                "loads_with": how if difference <= ATOL else "neither",
                "loaded_difference": difference,
                "from_pretrained_error": error,
            }
    return checks


def prefill(model: nn.Module, tokens: Tensor) -> Callable[[], None]:
    """The prompt pass of ``generate``: the cache filled, the last position's logits."""

    def run() -> None:
        with torch.no_grad():
            model(tokens, use_cache=True, logits_to_keep=1)

    return run


def decode(model: Any, prompt: Tensor, new_tokens: int) -> Callable[[], None]:
    """Greedy ``generate`` of exactly ``new_tokens`` tokens with the KV cache."""

    def run() -> None:
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )
        if out.shape[1] != prompt.shape[1] + new_tokens:
            raise RuntimeError(f"Expected {new_tokens} new tokens, but got {out.shape}.")

    return run


def _seconds(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def time_in_pairs(
    models: dict[str, Any], size: Size, repeats: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """Seconds of each model's prefill and decoding, each shrunk model's turn beside a dense
    turn (dense first in even rounds, second in odd ones; the shrunk models' order rotating
    each round), and each pair's ratio, dense over shrunk."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(size.vocab, (size.batch, size.tokens), generator=generator)
    prompt = torch.randint(size.vocab, (1, size.prompt), generator=generator)
    calls = {
        name: {"prefill": prefill(model, tokens), "decode": decode(model, prompt, size.new_tokens)}
        for name, model in models.items()
    }
    for name, model in models.items():  # warm-up: allocator, lazy imports, generate's set-up
        calls[name]["prefill"]()
        decode(model, prompt, 2)()
    times: dict[str, dict[str, list[float]]] = {
        name: {"prefill": [], "decode": []} for name in models
    }
    shrunk = [name for name in models if name != "dense"]
    ratios = {name: {"prefill": [], "decode": []} for name in shrunk}
    for round_index in range(repeats):
        shift = round_index % len(shrunk)
        for name in shrunk[shift:] + shrunk[:shift]:
            pair = ("dense", name) if round_index % 2 == 0 else (name, "dense")
            for way in ("prefill", "decode"):
                seconds = {who: _seconds(calls[who][way]) for who in pair}
                for who in pair:
                    times[who][way].append(seconds[who])
                ratios[name][way].append(seconds["dense"] / seconds[name])
        dense = times["dense"]
        print(
            f"  round {round_index + 1}/{repeats}: dense prefill "
            f"{statistics.median(dense['prefill'][-len(shrunk) :]):.2f} s, decode "
            f"{statistics.median(dense['decode'][-len(shrunk) :]):.2f} s, load "
            f"{os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return times, ratios


def measure(size: Size, repeats: int) -> dict[str, Any]:
    """Every configuration shrunk, saved, loaded back and timed against the dense model."""
    dense = build_llama(size)
    probe = torch.randint(
        size.vocab, (2, min(size.tokens, 32)), generator=torch.Generator().manual_seed(2)
    )
    models: dict[str, Any] = {"dense": dense}
    rows: dict[str, dict[str, Any]] = {
        "dense": {
            "kind": None,
            "units": [],
            "parameters": parameters(dense),
            "block_parameters": block_parameters(dense),
        }
    }
    configs = [(label, kind, ((kind, fraction),)) for label, kind, fraction in CONFIGS]
    for label, kind, units in [*configs, (FLOOR, FLOOR, FLOOR_UNITS)]:
        shrunk = shrunk_copy(dense, units, probe)
        models[label] = shrunk["model"]
        rows[label] = {
            "kind": kind,
            "units": units,
            "parameters": parameters(shrunk["model"]),
            "block_parameters": block_parameters(shrunk["model"]),
            "report_removed": shrunk["report"].removed,
            "config": shrunk["report"].config,
            "masked_difference": shrunk["masked_difference"],
        }
        print(f"  {label}: {rows[label]['parameters'] / 1e6:.2f}M parameters", flush=True)
    with tempfile.TemporaryDirectory() as work:
        folders = {name: Path(work) / f"model{i}" for i, name in enumerate(models)}
        for name, model in models.items():
            rows[name]["file_bytes"] = save(model, folders[name])
        for name, check in check_loading(models, folders, probe, Path(work)).items():
            rows[name].update(check)
    load_before = os.getloadavg()
    times, ratios = time_in_pairs(models, size, repeats)
    load_after = os.getloadavg()
    base = rows["dense"]
    for name, row in rows.items():
        row["seconds"] = times[name]
        row["prefill_seconds"] = statistics.median(times[name]["prefill"])
        row["decode_tokens_per_second"] = size.new_tokens / statistics.median(times[name]["decode"])
        for way in ("prefill", "decode"):
            pairs = ratios.get(name, {way: [1.0]})[way]
            row[f"{way}_speed_up"] = statistics.median(pairs)
            row[f"{way}_ratios"] = pairs
        row["removed"] = 1 - row["parameters"] / base["parameters"]
        row["expected_prefill_speed_up"] = base["block_parameters"] / row["block_parameters"]
        row["expected_decode_speed_up"] = base["parameters"] / row["parameters"]
    return {
        "size": size._asdict(),
        "repeats": repeats,
        "rows": rows,
        "load_average": {"before": load_before, "after": load_after},
    }


def _speed_up(row: dict[str, Any], way: str) -> str:
    """The median speed-up, with the range of the pairs' ratios where there are several."""
    text = f"{row[f'{way}_speed_up']:.2f}x"
    pairs = row[f"{way}_ratios"]
    if len(pairs) > 1:
        text += f" ({min(pairs):.2f}-{max(pairs):.2f})"
    return text


def markdown(results: dict[str, Any]) -> str:
    size, machine = results["size"], results["machine"]
    lines = [
        "| model | parameters | removed | file (MB) | prefill (s) | prefill speed-up "
        "| if it followed block parameters | decoding (tokens/s) | decoding speed-up "
        "| if it followed all parameters | loads |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["rows"].items():
        loads = {"from_pretrained": "yes", "load_shrunk": "with `load_shrunk`"}.get(
            row["loads_with"], "no"
        )
        if name == FLOOR:
            name = "floor: 1 FFN channel, 1 key/value head per layer"
        lines.append(
            f"| {name} | {row['parameters'] / 1e6:.1f}M | {row['removed']:.1%} "
            f"| {row['file_bytes'] / 1e6:.1f} | {row['prefill_seconds']:.2f} "
            f"| {_speed_up(row, 'prefill')} | {row['expected_prefill_speed_up']:.2f}x "
            f"| {row['decode_tokens_per_second']:.1f} | {_speed_up(row, 'decode')} "
            f"| {row['expected_decode_speed_up']:.2f}x | {loads} |"
        )
    load = results["load_average"]
    lines += [
        "",
        f"A Llama of hidden size {size['hidden']}, {size['layers']} layers, {size['heads']} "
        f"query heads on {size['kv_heads']} key/value heads, FFN {size['intermediate']}, "
        f"vocabulary {size['vocab']} (LM head tied), float32, random init; shrunk by magnitude "
        "per unit, uniform widths. Prefill: one forward of "
        f"{size['batch']}x{size['tokens']} tokens; decoding: greedy `generate` of "
        f"{size['new_tokens']} tokens at batch 1 with the KV cache. Speed-ups: the median over "
        f"{counted(results['repeats'], 'round')} of the time of a dense turn over the time of the "
        "shrunk model's turn right beside it (the two in alternating order), in brackets the "
        "lowest and highest of these ratios; seconds and tokens/s: the medians. The two 'if "
        "it followed' columns are the speed-ups proportional to the parameters in the blocks "
        "(prefill) and to all parameters, LM head included (decoding). The floor keeps one FFN "
        "channel and one key/value head (with its query heads) in every layer: what removing "
        "channels and heads cannot take away (the LM head, the norms, each layer's fixed work "
        "per forward). Loads: plain `AutoModelForCausalLM.from_pretrained` of the "
        "`save_pretrained` folder in a process without tensorplay gives the shrunk model's "
        "logits (with `load_shrunk`: transformers refuses the config, whose hidden size must "
        "be a multiple of the number of heads; tensorplay's `load_shrunk` loads it). "
        f"CPU ({machine['cpus']} CPUs, {machine['threads']} torch "
        f"thread{'s' if machine['threads'] > 1 else ''}), torch "
        f"{machine['torch']}, transformers {machine['transformers']}.",
    ]
    if noisy := other_work(max(load["before"][0], load["after"][0]), machine["cpus"]):
        lines[-1] += f" {noisy}"
    return "\n".join(lines) + "\n"


# One marker, colour and legend entry per kind of unit, the same in both panels; the label of a
# point goes above it, below it or to its right by kind (an offset in points), so that
# neighbours' labels do not meet.
KIND_STYLE = {
    "channel": ("o", "tab:blue", "FFN channels: 25, 50, 75%", (0, -13)),
    "head": ("s", "tab:orange", "heads: 25, 50%", (0, 6)),
    "layer": ("D", "tab:green", "layers: 25%", (7, -3)),
    FLOOR: ("X", "tab:gray", "floor: 1 FFN channel, 1 key/value head per layer", (0, 6)),
}


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``structured_speed.png``: prefill and decoding latency against parameters removed.

    Two panels, latency as a fraction of the dense model's; one point per shrunk model,
    labelled with its speed-up; the dashed line is latency proportional to the parameters that
    part of the work reads (the blocks' for prefill, all of them for decoding); the dotted line
    the floor's latency, which no pruning of channels and heads goes below.
    """
    from plotting import new_figure, save

    rows = {name: row for name, row in results["rows"].items() if name != "dense"}
    dense = results["rows"]["dense"]
    figure = new_figure(9.0, 4.0)
    panels = figure.subplots(1, 2, sharey=True)
    size = results["size"]
    largest = max(row["removed"] for row in rows.values())
    highest = 1.0
    legend: dict[str, Any] = {}
    for axes, way, title, reference, share in (
        (
            panels[0],
            "prefill",
            f"prefill, {size['batch']}x{size['tokens']} tokens",
            "block parameters",
            dense["block_parameters"] / dense["parameters"],
        ),
        (
            panels[1],
            "decode",
            f"greedy decoding, batch 1, {size['new_tokens']} tokens",
            "all parameters",
            1.0,
        ),
    ):
        xs = [0.0, min(share, largest * 1.15)]
        (line,) = axes.plot(
            [100 * x for x in xs], [1 - x / share for x in xs], linestyle="--", color="tab:gray"
        )
        legend[f"latency proportional to {reference} ({way})"] = line
        axes.axhline(1 / rows[FLOOR][f"{way}_speed_up"], linestyle=":", color="tab:gray")
        for row in rows.values():
            marker, color, kind, offset = KIND_STYLE[row["kind"]]
            speed_up = row[f"{way}_speed_up"]
            x, y = 100 * row["removed"], 1 / speed_up
            highest = max(highest, y)
            (legend[kind],) = axes.plot(x, y, marker=marker, color=color, linestyle="none")
            axes.annotate(
                f"{speed_up:.2f}x",
                (x, y),
                xytext=offset,
                textcoords="offset points",
                ha="left" if offset[0] > 0 else "center",
                fontsize=8,
            )
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("parameters removed (% of the dense model)")
        axes.set_xlim(0, 100 * largest * 1.15)
        axes.grid(True, alpha=0.3)
    panels[0].set_ylabel("latency / dense latency")
    panels[0].set_ylim(0, highest + 0.15)  # room for the labels above the points
    lines = [key for key in legend if key.startswith("latency")]
    order = lines + [key for key in legend if key not in lines]
    figure.legend(
        [legend[key] for key in order], order, loc="outside lower center", ncols=2, fontsize=8
    )
    threads = results["machine"]["threads"]
    figure.suptitle(
        f"Shrunk against dense (labels: speed-up): a {dense['parameters'] / 1e6:.0f}M-parameter "
        f"Llama, CPU, {threads} thread{'s' if threads > 1 else ''}",
        fontsize=11,
    )
    return [save(figure, folder / f"{NAME}.png")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama, one round")
    parser.add_argument("--repeats", type=int, help="rounds of pairs (3; --tiny: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.plot is not None:
        plot_saved(plot, args.out / f"{NAME}.json", args.plot)
        return
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    size = TINY if args.tiny else FULL
    repeats = args.repeats or (1 if args.tiny else 3)
    results = measure(size, repeats)
    results["machine"] = machine("cpus", "threads", "platform", "torch", "transformers")
    table = markdown(results)
    write_results(args.out, NAME, results, table)
    print(table)


if __name__ == "__main__":
    main()
