"""How long the dependency graph takes to analyse a ~100M-parameter model of each family.

Run (about 30 seconds on 2 shared CPU cores)::

    python benchmarks/bench_family_analysis.py          # the table of benchmarks/README.md
    python benchmarks/bench_family_analysis.py --tiny   # seconds: what the slow-tier test runs

Each family's model is built from a transformers config of about 100M parameters (width 768,
12 heads, 12 layers, a vocabulary of 32,000 tokens for every text model; the MoE families with
8 experts of 768 channels, top-2, in 6 layers: about 145M) on the ``meta`` device, so no
weight is allocated nor initialised, and ``DependencyGraph(model)`` is timed on it: the median
of ``--repeats`` builds. A family whose analysis fails on ``meta`` is built on the CPU with
random init instead (the ``device`` column says which).

Results go to ``benchmarks/results/family_analysis.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

sys.path.append(str(Path(__file__).resolve().parent))

from harness import machine, size_label, write_results

from tensorplay.ao.pruning import DependencyGraph

ROOT = Path(__file__).resolve().parents[1]
# Width, layers, heads, FFN channels, vocabulary: about 100M parameters for a decoder.
BASE = {"hidden": 768, "layers": 12, "heads": 12, "ffn": 2048, "vocab": 32000, "experts_ffn": 768}
TINY = {"hidden": 32, "layers": 2, "heads": 4, "ffn": 64, "vocab": 128, "experts_ffn": 16}


def _decoder(size: dict[str, int], **extra: Any) -> dict[str, Any]:
    config = dict(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["ffn"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"] // 2 or 1, max_position_embeddings=2048,
        pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return {**config, **extra}


def _moe(size: dict[str, int], **extra: Any) -> dict[str, Any]:
    common = _decoder(size, num_experts_per_tok=2, **extra)
    common["num_hidden_layers"] = max(1, size["layers"] // 2)
    return common


def families(size: dict[str, int]) -> dict[str, Callable[[], nn.Module]]:
    """Each family's model builder at ``size`` (called under the device context)."""
    t = transformers
    head_dim = size["hidden"] // size["heads"]
    h, layers, heads = size["hidden"], size["layers"], size["heads"]
    return {
        "Llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**_decoder(size))),
        "Qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**_decoder(size, head_dim=head_dim))),
        "Gemma 2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(**_decoder(size, head_dim=head_dim))),
        "Gemma 3": lambda: t.Gemma3ForCausalLM(
            t.Gemma3TextConfig(**_decoder(size, head_dim=head_dim))
        ),
        "Phi-3": lambda: t.Phi3ForCausalLM(t.Phi3Config(**_decoder(size))),
        "OLMo 2": lambda: t.Olmo2ForCausalLM(t.Olmo2Config(**_decoder(size))),
        "GPT-NeoX": lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**_decoder(size))),
        "GPT-2": lambda: t.GPT2LMHeadModel(
            t.GPT2Config(
                vocab_size=size["vocab"],
                n_embd=h,
                n_layer=layers,
                n_head=heads,
                n_positions=1024,
            )
        ),
        "BERT": lambda: t.BertForMaskedLM(
            t.BertConfig(
                vocab_size=size["vocab"],
                hidden_size=h,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=4 * h,
            )
        ),
        "ViT": lambda: t.ViTForImageClassification(
            t.ViTConfig(
                hidden_size=h,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=4 * h,
                image_size=224,
                patch_size=16,
            )
        ),
        "Qwen3-MoE": lambda: t.Qwen3MoeForCausalLM(
            t.Qwen3MoeConfig(
                **_moe(
                    size,
                    num_experts=8,
                    moe_intermediate_size=size["experts_ffn"],
                    head_dim=head_dim,
                )
            )
        ),
        "Mixtral": lambda: t.MixtralForCausalLM(
            t.MixtralConfig(
                **_moe(
                    size,
                    num_local_experts=8,
                    intermediate_size=size["experts_ffn"],
                )
            )
        ),
    }


def analyse(build: Callable[[], nn.Module], repeats: int) -> dict[str, Any]:
    """Build the model on ``meta`` (on the CPU if its analysis fails there) and time
    ``DependencyGraph`` ``repeats`` times."""
    for device in ("meta", "cpu"):
        with torch.device(device):
            model = build()
        try:
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                DependencyGraph(model)
                seconds.append(time.perf_counter() - started)
        except Exception as error:  # the table says which device it ran on
            print(f"  on {device}: {type(error).__name__}: {error}"[:300], flush=True)
            continue
        params = sum(p.numel() for p in model.parameters())
        return {"device": device, "params": params, "seconds": statistics.median(seconds),
                "all_seconds": seconds}  # fmt: skip
    raise RuntimeError("Expected the analysis to run on meta or on the CPU, but it failed on both.")


def tables(result: dict[str, Any]) -> str:
    """The Markdown table, with its caption."""
    lines = [
        f"`DependencyGraph(model)`: median of {result['repeats']} builds per family, CPU.",
        "",
        "| family | params | built on | seconds |",
        "|---|---:|---|---:|",
    ]
    for name, row in result["families"].items():
        lines.append(
            f"| {name} | {size_label(row['params'])} | {row['device']} | {row['seconds']:.3f} |"
        )
    lines += ["", "Measured by `benchmarks/bench_family_analysis.py`."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny configs, one build: seconds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    size = BASE
    if args.tiny:
        size, args.repeats = TINY, 1
    rows = {}
    for name, build in families(size).items():
        rows[name] = analyse(build, args.repeats)
        print(f"{name}: {size_label(rows[name]['params'])} on {rows[name]['device']}, "
              f"{rows[name]['seconds']:.3f} s", flush=True)  # fmt: skip
    result = {
        "families": rows, "repeats": args.repeats, "size": size,
        "machine": machine("cpus", "threads", "load", "torch", "transformers"),
    }  # fmt: skip
    table = tables(result)
    print(table)
    write_results(args.out, "family_analysis", result, table)
    return result


if __name__ == "__main__":
    main()
