"""Torch-Pruning against tensorplay: the same structured pruning of a CNN and of a Llama.

Run (about 10 minutes on a 2-core machine)::

    pip install torch-pruning                                  # or: pip install -e ".[bench]"
    python benchmarks/bench_structured_peer.py                 # ResNet-18 and the 100M Llama
    python benchmarks/bench_structured_peer.py --timeout 300   # give Torch-Pruning longer
    python benchmarks/bench_structured_peer.py --tiny --no-peer  # tensorplay alone, tiny

Without ``torch-pruning`` installed (or with ``--no-peer``) tensorplay's side runs alone and the
results say so.

**CNN**: the ResNet-18 of ``bench_structure_tracing.py`` (basic blocks, BatchNorm, random init;
BatchNorm's scales, shifts and running statistics drawn at random, as after training), eval
mode, one 1x3x224x224 image. Half of the channels of every prunable group go, by magnitude:

* **tensorplay**: ``DependencyGraph(model, example_inputs=image)`` (torch.fx tracing), the
  units of lowest root mean square ``|w|`` of each group masked, then ``shrink``;
* **Torch-Pruning**: ``BasePruner(model, image, MagnitudeImportance(p=2), pruning_ratio=0.5,
  ignored_layers=[fc])`` and ``step()``; and, apart, Torch-Pruning removing exactly the channels
  tensorplay chose (``get_pruning_group(conv, prune_conv_out_channels, idxs).prune()``).

Measured: the time to analyse and prune (the median of ``--repeats`` fresh copies), parameters
after, the latency of one image after (in turns with the dense model, ``--cnn-rounds`` rounds,
the median of the rounds' ratios), and how far outputs are from tensorplay's masked model:
tensorplay's shrunk model, Torch-Pruning's pruning of the same channels, and masking the same
convolution filters alone (what ``torch.nn.utils.prune.ln_structured`` masks: BatchNorm's shift
still passes).

**Llama**: the 100M-parameter Llama of ``bench_structured_speed.py``, three Torch-Pruning recipes,
each in a fresh process whose pruning is stopped after ``--timeout`` seconds (default 120):

* **FFN 50%**: every Linear and the embedding in ``ignored_layers`` except ``gate_proj`` and
  ``up_proj``, ``pruning_ratio=0.5``: the FFN channels alone, as tensorplay's ``"channel"``;
* **heads 50%**: every Linear and the embedding ignored except ``q/k/v_proj``, their head counts
  in ``num_heads``, ``prune_num_heads=True``, ``prune_head_dims=False``,
  ``head_pruning_ratio=0.5``: as tensorplay's ``"head"``;
* **every width 50%**: Torch-Pruning's own recipe for LLMs (``ignored_layers=[lm_head]``: the
  residual width too, which tensorplay never prunes).

Where Torch-Pruning finishes: the time to prune, parameters, the prefill latency (4x256 tokens)
in turns with the dense model and tensorplay's shrunk model, whether its logits equal
tensorplay's at the same ratio, and whether ``save_pretrained`` then plain
``AutoModelForCausalLM.from_pretrained`` loads it. Where it does not: the Torch-Pruning function
it was in. tensorplay's time and parameters for the same recipe come from the same process.

Results go to ``benchmarks/results/structured_peer.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_structure_tracing import resnet18
from bench_structured_speed import FULL, TINY, Size, build_llama, parameters, prune_by_magnitude
from harness import in_turns, machine, other_work, worker_json, write_results

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "structured_peer"
FRACTION = 0.5
RECIPES = ("FFN 50%", "heads 50%", "every width 50%")
# tensorplay's kind of unit for each recipe (none prunes the residual width).
TENSORPLAY_KIND = {"FFN 50%": "channel", "heads 50%": "head", "every width 50%": None}


def peer_installed() -> bool:
    """Whether Torch-Pruning can be imported."""
    return importlib.util.find_spec("torch_pruning") is not None


def _seconds(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def _in_turns(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each call, the order rotating each round, after one warm-up of each."""
    for call in calls.values():
        call()
    return in_turns(calls, repeats, steps=1)


def _speed_ups(times: dict[str, list[float]]) -> dict[str, float]:
    """The median over the rounds of each round's dense time over each model's."""
    dense = times["dense"]
    return {
        name: statistics.median(d / t for d, t in zip(dense, values, strict=True))
        for name, values in times.items()
    }


def _difference(output: Tensor, reference: Tensor) -> dict[str, float]:
    absolute = (output - reference).abs().max().item()
    return {"max_abs": absolute, "relative": absolute / reference.abs().max().item()}


# --- the CNN -------------------------------------------------------------------------------


def residual_cnn(tiny: bool) -> tuple[nn.Module, Tensor]:
    """ResNet-18 (widths 4-32 at 32x32 when tiny) in eval mode with BatchNorm's parameters and
    running statistics drawn at random, and one image."""
    widths, classes, side = ((4, 8, 16, 32), 10, 32) if tiny else ((64, 128, 256, 512), 1000, 224)
    model = resnet18(widths, classes)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                channels = module.num_features
                module.weight.copy_(0.5 + torch.rand(channels, generator=generator))
                module.bias.copy_(0.2 * torch.randn(channels, generator=generator))
                module.running_mean.copy_(0.2 * torch.randn(channels, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(channels, generator=generator))
    return model.eval(), torch.randn(1, 3, side, side, generator=generator)


def _conv_roots(model: nn.Module, groups: list[Any]) -> list[tuple[str, Any]]:
    """For each group, a convolution whose output channels are its units (Torch-Pruning's
    root for the same group)."""
    roots = []
    for group in groups:
        for piece in group.slices:
            module_name, _, local = piece.parameter.rpartition(".")
            module = model.get_submodule(module_name)
            if isinstance(module, nn.Conv2d) and local == "weight" and piece.dim == 0:
                roots.append((module_name, group))
                break
        else:
            raise ValueError(f"Expected group {group.name!r} to hold a convolution's filters.")
    return roots


def _pruned_indices(model: nn.Module, group: Any) -> list[int]:
    """The units of ``group`` whose scored slices are all zero in ``model`` (masked)."""
    from tensorplay.ao.pruning.structured.dependency.unit_groups import pruned_units

    masks = {name: model.get_parameter(name).detach() for name in group.parameters()}
    return torch.nonzero(pruned_units(group, masks)).flatten().tolist()


def cnn(tiny: bool, repeats: int, peer: bool, rounds: int | None = None) -> dict[str, Any]:
    """tensorplay and Torch-Pruning on the residual CNN (see the module docstring): each
    tool's pruning timed on ``repeats`` copies, the latency over ``rounds`` rounds (default:
    ``repeats``)."""
    from tensorplay.ao.pruning import shrink

    dense, image = residual_cnn(tiny)
    with torch.no_grad():
        dense_out = dense(image)

    def tensorplay_prune() -> tuple[float, nn.Module, Tensor, list[Any]]:
        model = copy.deepcopy(dense)
        masking, groups = _seconds(
            lambda: prune_by_magnitude(model, "channel", FRACTION, example_inputs=image)
        )
        with torch.no_grad():
            masked = model(image)
        shrinking, _ = _seconds(lambda: shrink(model, groups=groups))
        return masking + shrinking, model, masked, groups

    # One untimed run first, for each tool: the first tracing of a process imports parts of
    # torch (torch._refs, torch._dynamo) that any later one finds loaded.
    runs = [tensorplay_prune() for _ in range(repeats + 1)][1:]
    _, shrunk, masked, groups = runs[0]
    masked_copy = copy.deepcopy(dense)
    prune_by_magnitude(masked_copy, "channel", FRACTION, example_inputs=image)
    pruned = [_pruned_indices(masked_copy, group) for group in groups]
    with torch.no_grad():
        rows: dict[str, Any] = {
            "dense": {"parameters": parameters(dense)},
            "tensorplay": {
                "seconds": statistics.median(run[0] for run in runs),
                "parameters": parameters(shrunk),
                "vs_masked": _difference(shrunk(image), masked),
            },
            "filters alone masked": {
                "vs_masked": _difference(_filters_masked(dense, groups, pruned)(image), masked)
            },
        }
    models: dict[str, nn.Module] = {"dense": dense, "tensorplay": shrunk}
    if peer:
        peer_rows, peer_model = _torch_pruning_cnn(dense, image, groups, pruned, masked, repeats)
        rows.update(peer_rows)
        models["Torch-Pruning"] = peer_model
        with torch.no_grad():
            rows["Torch-Pruning"]["vs_tensorplay"] = _difference(peer_model(image), shrunk(image))
    with torch.no_grad():
        calls = {name: (lambda m=model: m(image)) for name, model in models.items()}
        times = _in_turns(calls, rounds or repeats)
    for name, speed_up in _speed_ups(times).items():
        rows[name]["latency_seconds"] = statistics.median(times[name])
        rows[name]["speed_up"] = speed_up
    return {
        "image": list(image.shape),
        "groups": len(groups),
        "units": sum(group.size for group in groups),
        "dense_output_scale": dense_out.abs().max().item(),
        "rows": rows,
    }


def _filters_masked(dense: nn.Module, groups: list[Any], pruned: list[list[int]]) -> nn.Module:
    """The dense model with the same convolution filters zeroed, nothing else (BatchNorm kept)."""
    model = copy.deepcopy(dense)
    with torch.no_grad():
        for group, units in zip(groups, pruned, strict=True):
            for piece in group.slices:
                module_name, _, local = piece.parameter.rpartition(".")
                module = model.get_submodule(module_name)
                if isinstance(module, nn.Conv2d) and local == "weight" and piece.dim == 0:
                    for unit in units:
                        module.weight[piece.index(unit, module.weight.dim())] = 0
    return model


def _torch_pruning_cnn(
    dense: nn.Module,
    image: Tensor,
    groups: list[Any],
    pruned: list[list[int]],
    masked: Tensor,
    repeats: int,
) -> tuple[dict[str, Any], nn.Module]:
    import torch_pruning as tp

    def own() -> nn.Module:
        model = copy.deepcopy(dense)
        pruner = tp.pruner.BasePruner(
            model,
            image,
            importance=tp.importance.MagnitudeImportance(p=2),
            pruning_ratio=FRACTION,
            ignored_layers=[model.fc],
        )
        pruner.step()
        return model

    runs = [_seconds(own) for _ in range(repeats + 1)][1:]
    model = runs[0][1]
    same = copy.deepcopy(dense)
    graph = tp.DependencyGraph().build_dependency(same, example_inputs=image)
    for (root, _), units in zip(_conv_roots(same, groups), pruned, strict=True):
        group = graph.get_pruning_group(
            same.get_submodule(root), tp.prune_conv_out_channels, idxs=units
        )
        group.prune()
    with torch.no_grad():
        rows = {
            "Torch-Pruning": {
                "seconds": statistics.median(run[0] for run in runs),
                "parameters": parameters(model),
            },
            "Torch-Pruning, tensorplay's channels": {
                "parameters": parameters(same),
                "vs_masked": _difference(same(image), masked),
            },
        }
    return rows, model


# --- the Llama -----------------------------------------------------------------------------


class _TimeLimit(Exception):
    """Torch-Pruning ran past the time limit."""


def _torch_pruning_llama(model: Any, recipe: str, example: Tensor) -> None:
    """Torch-Pruning's pruning of ``model`` by ``recipe`` (see the module docstring)."""
    import torch_pruning as tp

    options: dict[str, Any] = {}
    if recipe == "every width 50%":
        ignored = [model.lm_head]
    else:
        kept = ("gate_proj", "up_proj") if recipe == "FFN 50%" else ("q_proj", "k_proj", "v_proj")
        ignored = [
            module
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear | nn.Embedding) and not name.endswith(kept)
        ]
    if recipe == "heads 50%":
        config = model.config
        attention = [layer.self_attn for layer in model.model.layers]
        heads = {a.q_proj: config.num_attention_heads for a in attention}
        for a in attention:
            heads[a.k_proj] = heads[a.v_proj] = config.num_key_value_heads
        options = {
            "num_heads": heads,
            "prune_num_heads": True,
            "prune_head_dims": False,
            "head_pruning_ratio": FRACTION,
        }
    pruner = tp.pruner.BasePruner(
        model,
        example,
        importance=tp.importance.MagnitudeImportance(p=2),
        pruning_ratio=0.0 if recipe == "heads 50%" else FRACTION,
        ignored_layers=ignored,
        output_transform=lambda output: output.logits,
        **options,
    )
    pruner.step()


def _where(error: BaseException) -> list[str]:
    """The innermost Torch-Pruning frames of ``error``'s traceback, as ``function (file:line)``."""
    frames = traceback.extract_tb(error.__traceback__)
    inside = [f for f in frames if "torch_pruning" in f.filename]
    return [
        f"{frame.name} ({frame.filename.split('torch_pruning/')[-1]}:{frame.lineno})"
        for frame in inside[-3:]
    ]


def llama_recipe(recipe: str, size: Size, timeout: int, repeats: int, peer: bool) -> dict[str, Any]:
    """tensorplay and (with ``peer``) Torch-Pruning on the Llama by ``recipe``."""
    from tensorplay.ao.pruning import shrink

    dense = build_llama(size)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(size.vocab, (size.batch, size.tokens), generator=generator)
    result: dict[str, Any] = {"recipe": recipe, "dense_parameters": parameters(dense)}
    models: dict[str, Any] = {"dense": dense}
    kind = TENSORPLAY_KIND[recipe]
    if kind is not None:
        ours = copy.deepcopy(dense)
        masking, groups = _seconds(lambda: prune_by_magnitude(ours, kind, FRACTION))
        shrinking, _ = _seconds(lambda: shrink(ours, groups=groups))
        result["tensorplay"] = {
            "seconds": masking + shrinking,
            "parameters": parameters(ours),
            "loads": _loads(ours, tokens[:1, :8]),
        }
        models["tensorplay"] = ours
    if peer:
        theirs = copy.deepcopy(dense)
        example = tokens[:1, :16]
        signal.signal(signal.SIGALRM, _raise_time_limit)
        signal.alarm(timeout)
        start = time.perf_counter()
        try:
            _torch_pruning_llama(theirs, recipe, example)
            status: dict[str, Any] = {"status": "finished"}
        except _TimeLimit as error:
            status = {"status": f"stopped after {timeout} s", "where": _where(error)}
        except Exception as error:
            status = {"status": "error", "error": f"{type(error).__name__}: {error}"[:500]}
            status["where"] = _where(error)
        finally:
            signal.alarm(0)
        status["seconds"] = time.perf_counter() - start
        if status["status"] == "finished":
            status["parameters"] = parameters(theirs)
            status["loads"] = _loads(theirs, tokens[:1, :8])
            status["config_widths"] = _config_widths(theirs)
            if "tensorplay" in models:
                with torch.no_grad():
                    status["vs_tensorplay"] = _difference(
                        theirs(tokens[:1, :8]).logits, models["tensorplay"](tokens[:1, :8]).logits
                    )
            models["Torch-Pruning"] = theirs
        result["Torch-Pruning"] = status
    if len(models) > 1:
        with torch.no_grad():
            calls = {
                name: (lambda m=model: m(tokens, use_cache=True, logits_to_keep=1))
                for name, model in models.items()
            }
            times = _in_turns(calls, repeats)
        for name, speed_up in _speed_ups(times).items():
            if name != "dense":
                result[name]["prefill_seconds"] = statistics.median(times[name])
                result[name]["prefill_speed_up"] = speed_up
        result["dense_prefill_seconds"] = statistics.median(times["dense"])
    return result


def _config_widths(model: Any) -> dict[str, list[int]]:
    """What the config says and what the first block has: FFN width and query heads."""
    block, config = model.model.layers[0], model.config
    return {
        "intermediate_size": [config.intermediate_size, block.mlp.up_proj.out_features],
        "query_heads": [
            config.num_attention_heads,
            block.self_attn.q_proj.out_features // block.self_attn.head_dim,
        ],
    }


def _raise_time_limit(signum: int, frame: Any) -> None:
    raise _TimeLimit


def _loads(model: Any, probe: Tensor) -> str:
    """What plain ``save_pretrained`` then ``AutoModelForCausalLM.from_pretrained`` gives."""
    import transformers

    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        model.save_pretrained(folder)
        try:
            loaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        except Exception as error:
            if "mismatch" in str(error):  # transformers' load report names the tensors
                return "no: size mismatch (from_pretrained builds the widths of the config)"
            return f"no: {type(error).__name__}: {_first_line(error)}"
        same = torch.allclose(loaded(probe).logits, model(probe).logits, atol=1e-4)
    return "yes, the same logits" if same else "loads, but its logits differ"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines or [""])[0][:300]


def llama_in_fresh_process(
    recipe: str, tiny: bool, timeout: int, repeats: int, peer: bool
) -> dict[str, Any]:
    """``llama_recipe`` in a new process (Torch-Pruning's state cannot leak into the next)."""
    command = [__file__, "--llama-worker", recipe, "--timeout", str(timeout)]
    command += ["--repeats", str(repeats), "--threads", str(torch.get_num_threads())]
    command += [*(["--tiny"] if tiny else []), *([] if peer else ["--no-peer"])]
    # The worker stops Torch-Pruning itself; this limit only guards against a hang in C code.
    result: dict[str, Any] = worker_json(*command, timeout=timeout + 1800)
    return result


# --- the report ----------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    machine, cnn_results = results["machine"], results["cnn"]
    rows = cnn_results["rows"]
    dense = rows["dense"]["parameters"]

    def seconds(row: dict[str, Any]) -> str:
        return f"{row['seconds']:.3f}" if "seconds" in row else ""

    def latency(row: dict[str, Any]) -> str:
        if "latency_seconds" not in row:
            return ""
        return f"{row['latency_seconds'] * 1e3:.1f} ({row['speed_up']:.2f}x)"

    def difference(row: dict[str, Any]) -> str:
        return f"{row['vs_masked']['relative']:.1e}" if "vs_masked" in row else ""

    lines = [
        "| ResNet-18, 50% of channels | analyse + prune (s) | parameters | latency, ms "
        "(speed-up) | output vs tensorplay's masked model (relative) |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        params = f"{row['parameters'] / 1e6:.2f}M" if "parameters" in row else ""
        if "parameters" in row and name != "dense":
            params += f" ({1 - row['parameters'] / dense:.0%} removed)"
        lines.append(f"| {name} | {seconds(row)} | {params} | {latency(row)} | {difference(row)} |")
    lines += [
        "",
        f"| Llama, {results['llama'][0]['dense_parameters'] / 1e6:.1f}M | tool | prune (s) "
        "| parameters | prefill speed-up | result |",
        "|---|---|---|---|---|---|",
    ]
    for recipe in results["llama"]:
        for tool in ("tensorplay", "Torch-Pruning"):
            row = recipe.get(tool)
            if row is None:
                continue
            params = f"{row['parameters'] / 1e6:.1f}M" if "parameters" in row else ""
            speed_up = f"{row['prefill_speed_up']:.2f}x" if "prefill_speed_up" in row else ""
            lines.append(
                f"| {recipe['recipe']} | {tool} | {row['seconds']:.2f} | {params} | {speed_up} "
                f"| {_outcome(row)} |"
            )
    peer = results["peer"]
    lines += [
        "",
        "ResNet-18 (BatchNorm with random statistics), one "
        f"{'x'.join(map(str, cnn_results['image']))} image, eval mode; by magnitude, half of each "
        f"prunable group's channels. Latency: the median over {results['cnn_rounds']} rounds "
        "in turns, the speed-up the median of the rounds' ratios to dense. Output differences: "
        "the largest over the outputs, relative to the largest output. 'Filters alone masked' "
        "zeroes the same convolution filters and nothing else, as "
        "`torch.nn.utils.prune.ln_structured` does. Llama: each recipe in a fresh process, "
        f"Torch-Pruning stopped after {results['timeout']} s; prefill: 4x256 tokens, "
        f"{results['repeats']} rounds in turns with the dense model. Result: plain "
        "`save_pretrained` then `AutoModelForCausalLM.from_pretrained`. "
        + (
            f"Torch-Pruning {peer}. "
            if peer
            else "Torch-Pruning not installed: its rows are left out "
            "(`pip install torch-pruning`). "
        )
        + f"CPU ({machine['cpus']} CPUs, {machine['threads']} torch "
        f"thread{'s' if machine['threads'] > 1 else ''}), torch "
        f"{machine['torch']}, transformers {machine['transformers']}.",
    ]
    if noisy := other_work(results["load_average"][0], machine["cpus"]):
        lines[-1] += f" {noisy}"
    return "\n".join(lines) + "\n"


def _outcome(row: dict[str, Any]) -> str:
    status = row.get("status", "finished")
    if status != "finished":
        where = ", ".join(f"`{frame.split(' (')[0]}`" for frame in row.get("where", []))
        text = status if status != "error" else f"error: {row['error']}"
        return f"{text}, in {where}" if where else text
    outcome = f"loads: {row['loads']}"
    if "config_widths" in row:
        said, has = row["config_widths"]["intermediate_size"]
        if said != has:
            outcome += f"; config.intermediate_size still {said}, the layers {has}"
    if "vs_tensorplay" in row:
        outcome += f"; logits vs tensorplay's {row['vs_tensorplay']['max_abs']:.1e}"
    return outcome.replace("|", "/")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny models, for the tests")
    parser.add_argument("--repeats", type=int, default=3, help="copies pruned; latency rounds")
    parser.add_argument("--cnn-rounds", type=int, default=20, help="CNN latency rounds")
    parser.add_argument("--timeout", type=int, default=120, help="seconds Torch-Pruning gets")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--no-peer", action="store_true", help="tensorplay alone")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    parser.add_argument("--llama-worker", choices=RECIPES, help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    peer = peer_installed() and not args.no_peer
    size = TINY if args.tiny else FULL
    if args.llama_worker is not None:
        result = llama_recipe(args.llama_worker, size, args.timeout, args.repeats, peer)
        print(json.dumps(result))
        return
    if not peer:
        print("Torch-Pruning left out: tensorplay alone (pip install torch-pruning to compare).")
    results: dict[str, Any] = {
        "peer": _peer_version() if peer else None,
        "repeats": args.repeats,
        "cnn_rounds": args.cnn_rounds,
        "timeout": args.timeout,
        "load_average": os.getloadavg(),
        "cnn": cnn(args.tiny, args.repeats, peer, args.cnn_rounds),
    }
    print("  CNN done", flush=True)
    results["llama"] = []
    for recipe in RECIPES if peer else [r for r in RECIPES if TENSORPLAY_KIND[r]]:
        if peer:
            worker = llama_in_fresh_process(recipe, args.tiny, args.timeout, args.repeats, peer)
        else:  # nothing to stop or to keep apart
            worker = llama_recipe(recipe, size, args.timeout, args.repeats, peer)
        results["llama"].append(worker)
        print(f"  {recipe} done", flush=True)
    results["machine"] = machine("cpus", "threads", "platform", "torch", "transformers")
    table = markdown(results)
    write_results(args.out, NAME, results, table)
    print(table)


def _peer_version() -> str:
    from importlib.metadata import version

    return version("torch-pruning")


if __name__ == "__main__":
    main()
