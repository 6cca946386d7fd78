"""The speed-ups, times and sizes the README and the docs quote are those of the results files.

Each claim is a pattern of a page's text (whitespace runs read as one space) whose numbers are
compared with the values they quote: a cell of a results table (``benchmarks/results/*.md``,
which must be what its benchmark script renders from the ``.json`` beside it) or a value derived
from the ``.json``. A quoted number agrees when it is the value rounded as the page rounds it:
within half a unit of its own last digit, plus half a unit of the table cell's last digit (a
value from the ``.json`` is exact). A pattern that no longer matches fails too, so a reworded
claim is brought back under the test.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

# Each results file quoted below: the script that writes it and its rendering function.
RENDERERS = {
    "callback_overhead": ("bench_callback_overhead", "markdown"),
    "export_size": ("bench_export_size", "table"),
    "global_unstructured": ("bench_global_unstructured", "markdown"),
    "hf_trainer_overhead": ("bench_hf_trainer_overhead", "markdown"),
    "large_model": ("bench_large_model", "markdown"),
    "latency": ("bench_latency", "table"),
    "reconstruction_cost": ("bench_reconstruction_cost", "tables"),
    "structured_peer": ("bench_structured_peer", "markdown"),
    "structured_speed": ("bench_structured_speed", "markdown"),
    "training_overhead": ("bench_training_overhead", "markdown"),
    "width": ("bench_width", "tables"),
    "width_seeds": ("bench_width_seeds", "tables"),
}


@dataclass(frozen=True)
class Value:
    """A quoted value and how precisely its source gives it (half a unit of its last digit)."""

    value: float
    slack: float = 0.0


def _number(text: str) -> Value:
    """The first number of a table cell (``"1.48x (1.07-1.55)"``, ``"28.3%"``, ``"1,024"``)."""
    found = re.search(r"-?\d[\d,]*(?:\.(\d+))?", text)
    assert found, f"no number in the cell {text!r}"
    decimals = len(found.group(1) or "")
    return Value(float(found.group(0).replace(",", "")), 0.5 * 10**-decimals)


@cache
def tables(path: Path) -> list[list[dict[str, str]]]:
    """Every markdown table of ``path``, each a list of rows keyed by the header's cells (a
    header repeated in one table keeps its first column)."""
    found: list[list[dict[str, str]]] = []
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        if not (line.startswith("|") and index + 1 < len(lines)):
            continue
        if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[index + 1]):
            continue
        header = [cell.strip() for cell in line.strip("|").split("|")]
        rows = []
        for row in lines[index + 2 :]:
            if not row.startswith("|"):
                break
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            keyed: dict[str, str] = {}
            for key, cell in zip(header, cells, strict=True):
                keyed.setdefault(key, cell)
            rows.append(keyed)
        found.append(rows)
    return found


def cell(name: str, where: dict[str, str], column: str, table: int = 0) -> Value:
    """The number in ``column`` of the one row of ``benchmarks/results/<name>.md`` (its
    ``table``-th table) whose cells include ``where``."""
    rows = [
        row
        for row in tables(RESULTS / f"{name}.md")[table]
        if all(row.get(key) == value for key, value in where.items())
    ]
    assert len(rows) == 1, (name, where, len(rows))
    return _number(rows[0][column])


def column(name: str, header: str, table: int = 0) -> list[Value]:
    """Every number of a column (cells without one, such as ``—``, left out)."""
    rows = tables(RESULTS / f"{name}.md")[table]
    return [_number(row[header]) for row in rows if re.search(r"\d", row[header])]


def lowest(values: list[Value]) -> Value:
    return min(values, key=lambda v: v.value)


def highest(values: list[Value]) -> Value:
    return max(values, key=lambda v: v.value)


def results(name: str) -> Any:
    return json.loads((RESULTS / f"{name}.json").read_text())


def page(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


def gu(params: str, call: str, header: str) -> Value:
    return cell("global_unstructured", {"params": params, "call": call}, header)


def ss(model: str, header: str) -> Value:
    return cell("structured_speed", {"model": model}, header)


def lm(params: str, way: str, header: str, bracketed: bool = False) -> Value:
    """A cell of the large-model table, or (``bracketed``) the number in its brackets, as the
    GiB of ``1.19 (3.35)``."""
    rows = tables(RESULTS / "large_model.md")[0]
    (row,) = [r for r in rows if r["parameters"].startswith(params) and r["way"] == way]
    text = row[header]
    if bracketed:
        inner = re.search(r"\(([^)]*)\)", text)
        assert inner, text
        text = inner.group(1)
    return _number(text)


def _second_over_first(params: str) -> Value:
    """The second call's time over the first's, from the table's cells (as a reader would)."""
    first, second = (gu(params, call, "tensorplay (s)") for call in ("first", "second"))
    ratio = second.value / first.value
    return Value(ratio, ratio * (first.slack / first.value + second.slack / second.value))


def _reconstruction_seconds(kind: str) -> tuple[Value, Value]:
    rows = [row for row in results("reconstruction")["rows"] if row["kind"] == kind]
    return (
        Value(statistics.median(row["reconstructed_seconds"] for row in rows)),
        Value(statistics.median(row["plain_seconds"] for row in rows)),
    )


def _peak_differences() -> list[Value]:
    rows = tables(RESULTS / "reconstruction_cost.md")[0]
    return [
        Value(
            _number(row["reconstructed peak (B/param)"]).value
            - _number(row["plain peak (B/param)"]).value,
            0.01,
        )
        for row in rows
    ]


def _ms_per_token(calibration: str) -> Value:
    """Reconstruction's CPU time per token (the second of the cell's two), by magnitude."""
    (found,) = [
        r
        for r in tables(RESULTS / "reconstruction_cost.md")[0]
        if r["importance"] == "magnitude" and r["calibration"] == calibration
    ]
    return _number(found["CPU ms per token"].split("/")[1])


def _plain_peaks(importance: str) -> list[Value]:
    rows = tables(RESULTS / "reconstruction_cost.md")[0]
    return [_number(r["plain peak (B/param)"]) for r in rows if r["importance"] == importance]


def _extrapolated_minutes() -> Value:
    text = (RESULTS / "reconstruction_cost.md").read_text()
    found = re.search(r"magnitude: [\d.]+ min plain, ([\d.]+) min reconstructed", text)
    assert found
    return _number(found.group(1))


def _example(name: str, row: str, header: str, table: int) -> Value:
    rows = tables(ROOT / "docs" / "results" / f"{name}.md")[table]
    (found,) = [r for r in rows if next(iter(r.values())) == row]
    return _number(found[header])


def _first_call_speed_ups() -> list[Value]:
    rows = tables(RESULTS / "global_unstructured.md")[0]
    return [_number(r["speed-up"]) for r in rows if r["call"] == "first" and r["speed-up"] != "—"]


GU_ALL = "global_unstructured", "speed-up"

# (page, pattern, the values its groups quote, in order)
CLAIMS: list[tuple[str, str, Callable[[], list[Value]]]] = [
    (
        "README.md",
        r"tensorplay ([\d.]+)x to ([\d.]+)x faster than torch\]",
        lambda: [lowest(column(*GU_ALL)), highest(column(*GU_ALL))],
    ),
    (
        "docs/choosing.rst",
        r"``global_unstructured`` ([\d.]+)x to ([\d.]+)x faster than torch's",
        lambda: [lowest(column(*GU_ALL)), highest(column(*GU_ALL))],
    ),
    (
        "docs/index.rst",
        r"on 2 CPU cores: ([\d.]+)x to ([\d.]+)x faster than ``torch.nn.utils.prune`` for a "
        r"first call, with ([\d.]+) bytes of extra memory per parameter at 200M where torch "
        r"takes (\d+)",
        lambda: [
            lowest(_first_call_speed_ups()),
            highest(_first_call_speed_ups()),
            gu("200M", "first", "tensorplay extra B/param"),
            gu("200M", "first", "torch extra B/param"),
        ],
    ),
    (
        "README.md",
        r"200M fp32 parameters: ([\d.]+) s against torch's ([\d.]+) s, ([\d.]+) against (\d+) "
        r"bytes/param of extra memory; 1B parameters in ([\d.]+) s",
        lambda: [
            gu("200M", "first", "tensorplay (s)"),
            gu("200M", "first", "torch (s)"),
            gu("200M", "first", "tensorplay extra B/param"),
            gu("200M", "first", "torch extra B/param"),
            gu("1B", "first", "tensorplay (s)"),
        ],
    ),
    (
        "docs/choosing.rst",
        r"a first global call takes ([\d.]+) s at 10M parameters on 2 CPU cores",
        lambda: [gu("10M", "first", "tensorplay (s)")],
    ),
    (
        "docs/performance.rst",
        r"a first call at 200M parameters spends about [\d.]+ s of its ([\d.]+) s .*? torch "
        r"spends (\d+) s",
        lambda: [gu("200M", "first", "tensorplay (s)"), gu("200M", "first", "torch (s)")],
    ),
    (
        "docs/performance.rst",
        r"at 1B it would need about (\d+) GB",
        lambda: [gu("200M", "first", "torch extra B/param")],
    ),
    (
        "docs/performance.rst",
        r"the second call takes ([\d.]+) times the first call's time at 50M, ([\d.]+) times at "
        r"200M and ([\d.]+) times at 1B",
        lambda: [_second_over_first(p) for p in ("50M", "200M", "1B")],
    ),
    (
        "README.md",
        r"A ([\d.]+)B-parameter bf16 model is pruned globally and exactly to 50% on a 24 GB "
        r"machine, in (\d+) s on two CPU cores, at a peak of ([\d.]+) bytes per parameter above "
        r"its weights, where torch's `global_unstructured` would need (\d+) \((\d+) GiB\)",
        lambda: [
            lm("3.02B", "lean", "parameters"),
            lm("3.02B", "lean", "time (s)"),
            lm("3.02B", "lean", "peak above the weights: B/param (GiB)"),
            lm("134M", "torch", "peak above the weights: B/param (GiB)"),
            lm("3.02B", "lean", "torch's peak at this size (GiB)"),
        ],
    ),
    (
        "docs/performance.rst",
        r"does it in (\d+) s on two CPU cores, at a peak of ([\d.]+) bytes per parameter above "
        r"the weights, its ``bool`` masks included \(([\d.]+) GiB\), and holds ([\d.]+) after it",
        lambda: [
            lm("3.02B", "lean", "time (s)"),
            lm("3.02B", "lean", "peak above the weights: B/param (GiB)"),
            lm("3.02B", "lean", "peak above the weights: B/param (GiB)", bracketed=True),
            lm("3.02B", "lean", "held: B/param"),
        ],
    ),
    (
        "docs/performance.rst",
        r"peaks at (\d+) bytes per parameter above the weights \(and takes (\d+) s there, where "
        r"the lean mode takes ([\d.]+) s\): at 3B that is (\d+) GiB",
        lambda: [
            lm("134M", "torch", "peak above the weights: B/param (GiB)"),
            lm("134M", "torch", "time (s)"),
            lm("134M", "lean", "time (s)"),
            lm("3.02B", "lean", "torch's peak at this size (GiB)"),
        ],
    ),
    *[
        (
            name,
            r"50% of (?:the|its) FFN channels(?: removed)? \((\d+)% of the parameters\)[,:]? "
            r"(?:makes )?prefill ([\d.]+)x and decoding ([\d.]+)x faster[,;] 75% of them,? "
            r"([\d.]+)x and ([\d.]+)x",
            lambda: [
                ss("FFN 50%", "removed"),
                ss("FFN 50%", "prefill speed-up"),
                ss("FFN 50%", "decoding speed-up"),
                ss("FFN 75%", "prefill speed-up"),
                ss("FFN 75%", "decoding speed-up"),
            ],
        )
        for name in ("README.md", "docs/index.rst")
    ],
    (
        "docs/choosing.rst",
        r"25% of the FFN channels removed made prefill ([\d.]+)x faster, 75% of them ([\d.]+)x",
        lambda: [ss("FFN 25%", "prefill speed-up"), ss("FFN 75%", "prefill speed-up")],
    ),
    (
        "docs/shrinking_llms.rst",
        r"\(([\d.]+)x for ([\d.]+)x at 25%, ([\d.]+)x for ([\d.]+)x at 75%\)",
        lambda: [
            ss("FFN 25%", "prefill speed-up"),
            ss("FFN 25%", "if it followed block parameters"),
            ss("FFN 75%", "prefill speed-up"),
            ss("FFN 75%", "if it followed block parameters"),
        ],
    ),
    (
        "docs/shrinking_llms.rst",
        r"at 75% of the FFN channels decoding is ([\d.]+)x faster where the parameters say "
        r"([\d.]+)x",
        lambda: [
            ss("FFN 75%", "decoding speed-up"),
            ss("FFN 75%", "if it followed all parameters"),
        ],
    ),
    (
        "docs/shrinking_llms.rst",
        r"25% of the layers \((\d+)% of the parameters\) decodes ([\d.]+)x faster, close to the "
        r"([\d.]+)x its parameters say, while 50% of the FFN channels \((\d+)% of the "
        r"parameters\) gives ([\d.]+)x where ([\d.]+)x was due",
        lambda: [
            ss("layers 25%", "removed"),
            ss("layers 25%", "decoding speed-up"),
            ss("layers 25%", "if it followed all parameters"),
            ss("FFN 50%", "removed"),
            ss("FFN 50%", "decoding speed-up"),
            ss("FFN 50%", "if it followed all parameters"),
        ],
    ),
    (
        "docs/shrinking_llms.rst",
        r"half of them is (\d+)% of this model",
        lambda: [ss("heads 50%", "removed")],
    ),
    (
        "docs/shrinking_llms.rst",
        r"slightly exceeds the parameters' \(([\d.]+)x for ([\d.]+)x\)",
        lambda: [
            ss("heads 50%", "prefill speed-up"),
            ss("heads 50%", "if it followed block parameters"),
        ],
    ),
    (
        "docs/shrinking_llms.rst",
        r"The floor copy has (\d+)% of the parameters removed, yet prefill is ([\d.]+)x faster "
        r"while the blocks shrank ([\d.]+)x, and decoding ([\d.]+)x where the parameters say "
        r"([\d.]+)x: .*? below about (\d+)% of the dense latency",
        lambda: [
            _floor("removed"),
            _floor("prefill speed-up"),
            _floor("if it followed block parameters"),
            _floor("decoding speed-up"),
            _floor("if it followed all parameters"),
            Value(100 / _floor("decoding speed-up").value, 0.15),
        ],
    ),
    (
        "docs/choosing.rst",
        r"``ModelPruning``: ([\d.]+)x a dense fit against ([\d.]+)x",
        lambda: [_fit("tensorplay"), _fit("lightning")],
    ),
    (
        "docs/migration_lightning.rst",
        r"the fit takes ([\d.]+)x a dense run with ``GradualPruning`` and ([\d.]+)x with "
        r"``ModelPruning``",
        lambda: [_fit("tensorplay"), _fit("lightning")],
    ),
    *[
        (
            name,
            r"about (\d+)% of the training thread's CPU time with the reparametrization",
            lambda: [
                Value(
                    100 * (_hf_cpu("reparametrize").value - 1), 100 * _hf_cpu("reparametrize").slack
                )
            ],
        )
        for name in ("docs/choosing.rst", "docs/huggingface_trainer.rst")
    ],
    (
        "docs/choosing.rst",
        r"90%, for ([\d.]+)x the step time",
        lambda: [_example("distillation", "time (ms)", "ratio", 1)],
    ),
    (
        "docs/distillation.rst",
        r"([\d.]+)x the time of a plain step and ([\d.]+)x its peak memory",
        lambda: [
            _example("distillation", "time (ms)", "ratio", 1),
            _example("distillation", "peak memory (MB)", "ratio", 1),
        ],
    ),
    (
        "docs/structured.rst",
        r"([\d.]+)x the parameters \(the embeddings and attention stay\), ([\d.]+)x the forward "
        r"time",
        lambda: [
            _example("structured", "parameters", "ratio", 1),
            _example("structured", "forward pass (ms)", "ratio", 1),
        ],
    ),
    (
        "docs/one_shot.rst",
        r"\*\*Cost\*\*: ([\d.]+) seconds against ([\d.]+) for a channel pruning \(([\d.]+) "
        r"against ([\d.]+) for heads\)",
        lambda: [*_reconstruction_seconds("channel"), *_reconstruction_seconds("head")],
    ),
    (
        "docs/one_shot.rst",
        r"([\d.]+) to ([\d.]+) times the CPU time of the plain call \((\d+) s against (\d+) s "
        r"with 4 x 256 calibration tokens by magnitude, (\d+) s against (\d+) s with 32 x 256\)",
        lambda: [
            lowest(column("reconstruction_cost", "ratio")),
            highest(column("reconstruction_cost", "ratio")),
            _cost("4 x 256", "reconstructed CPU (s)"),
            _cost("4 x 256", "plain CPU (s)"),
            _cost("32 x 256", "reconstructed CPU (s)"),
            _cost("32 x 256", "plain CPU (s)"),
        ],
    ),
    (
        "docs/one_shot.rst",
        r"falls from (\d+) to (\d+) ms between 1,024 and 8,192 tokens",
        lambda: [_ms_per_token("4 x 256"), _ms_per_token("32 x 256")],
    ),
    (
        "docs/one_shot.rst",
        r"would take about (\d+) minutes of CPU on one thread",
        lambda: [_extrapolated_minutes()],
    ),
    (
        "docs/one_shot.rst",
        r"adds ([\d.]+) to ([\d.]+) bytes per parameter to the plain call's peak",
        lambda: [lowest(_peak_differences()), highest(_peak_differences())],
    ),
    (
        "docs/one_shot.rst",
        r"\(([\d.]+) to ([\d.]+) bytes per parameter by magnitude, ([\d.]+) to ([\d.]+) by "
        r"Wanda\)",
        lambda: [
            lowest(_plain_peaks("magnitude")),
            highest(_plain_peaks("magnitude")),
            lowest(_plain_peaks("wanda")),
            highest(_plain_peaks("wanda")),
        ],
    ),
    (
        "docs/structured.rst",
        r"tensorplay prunes the heads in ([\d.]+) s",
        lambda: [
            cell(
                "structured_peer",
                {"Llama, 100.1M": "heads 50%", "tool": "tensorplay"},
                "prune (s)",
                table=1,
            )
        ],
    ),
    (
        "README.md",
        r"At 90% sparsity the compressed file of a ResNet-18 is ([\d.]+)x its dense one",
        lambda: [cell("export_size", {"file": "save_sparse (bitmask + non-zeros)"}, "vs dense")],
    ),
]


def _floor(header: str) -> Value:
    rows = tables(RESULTS / "structured_speed.md")[0]
    (row,) = [r for r in rows if r["model"].startswith("floor")]
    return _number(row[header])


def _fit(run: str) -> Value:
    return cell("callback_overhead", {"run": run}, "vs dense")


def _hf_cpu(run: str) -> Value:
    rows = tables(RESULTS / "hf_trainer_overhead.md")[0]
    (row,) = [r for r in rows if r["run"] == run]
    return _number(row["vs dense"])  # the first "vs dense": CPU time


def _width(pruned: str, removed: str, header: str) -> Value:
    return cell("width", {"pruned": pruned, "removed (asked)": removed}, header)


WIDTH_CLAIMS: list[tuple[str, str, Callable[[], list[Value]]]] = [
    (
        "docs/width.rst",
        r"80 FFN channels: ([\d.]+) one-shot where the best single axis \(the hidden size\) "
        r"scores ([\d.]+), and ([\d.]+) after recovery where the best \(FFN channels\) scores "
        r"([\d.]+)\.",
        lambda: [
            _width("searched mix (layer 1, channel 80)", "50%", "one-shot"),
            _width("hidden size", "50%", "one-shot"),
            _width("searched mix (layer 1, channel 80)", "50%", "recovered"),
            _width("FFN channels", "50%", "recovered"),
        ],
    ),
    (
        "docs/width.rst",
        r"\(([\d.]+) one-shot, ([\d.]+) recovered, against ([\d.]+) and ([\d.]+) for the global",
        lambda: [
            _width("searched mix (channel 234)", "25%", "one-shot"),
            _width("searched mix (channel 234)", "25%", "recovered"),
            _width("FFN channels", "25%", "one-shot"),
            _width("FFN channels", "25%", "recovered"),
        ],
    ),
    (
        "docs/width.rst",
        r"hidden size \(ranked by activations\) is ahead of channels \(([\d.]+) against "
        r"([\d.]+)\), but recovery brings channels back below it \(([\d.]+) against ([\d.]+)\)",
        lambda: [
            _width("hidden size", "50%", "one-shot"),
            _width("FFN channels", "50%", "one-shot"),
            _width("FFN channels", "50%", "recovered"),
            _width("hidden size", "50%", "recovered"),
        ],
    ),
]


def _seeds(pruned: str, removed: str, header: str) -> Value:
    return cell("width_seeds", {"pruned": pruned, "removed (asked)": removed}, header)


WIDTH_CLAIMS += [
    (
        "docs/width.rst",
        r"one-shot \(([\d.]+) on average, against ([\d.]+) for the hidden size and ([\d.]+) for "
        r"FFN channels\) and recovered \(([\d.]+) against ([\d.]+) for FFN channels\)",
        lambda: [
            _seeds("searched mix", "50%", "one-shot: mean (range)"),
            _seeds("hidden size", "50%", "one-shot: mean (range)"),
            _seeds("FFN channels", "50%", "one-shot: mean (range)"),
            _seeds("searched mix", "50%", "recovered: mean (range)"),
            _seeds("FFN channels", "50%", "recovered: mean (range)"),
        ],
    ),
    (
        "docs/width.rst",
        r"\(([\d.]+) against ([\d.]+) one-shot, ([\d.]+) against ([\d.]+) recovered\): there a "
        r"single axis",
        lambda: [
            _seeds("searched mix", "25%", "one-shot: mean (range)"),
            _seeds("FFN channels", "25%", "one-shot: mean (range)"),
            _seeds("searched mix", "25%", "recovered: mean (range)"),
            _seeds("FFN channels", "25%", "recovered: mean (range)"),
        ],
    ),
]
CLAIMS += WIDTH_CLAIMS


def _cost(calibration: str, header: str) -> Value:
    return cell(
        "reconstruction_cost", {"importance": "magnitude", "calibration": calibration}, header
    )


def agrees(quoted: str, expected: Value) -> bool:
    """``quoted`` is ``expected`` rounded to the digits it shows."""
    decimals = len(quoted.partition(".")[2])
    return abs(float(quoted) - expected.value) < 0.5 * 10**-decimals + expected.slack


@pytest.mark.parametrize(
    ("name", "pattern", "expected"),
    CLAIMS,
    ids=[f"{name}:{re.sub(r'[^a-z]+', '-', pattern[:40].lower())}" for name, pattern, _ in CLAIMS],
)
def test_the_page_quotes_its_results_file(
    name: str, pattern: str, expected: Callable[[], list[Value]]
) -> None:
    found = re.search(pattern, page(name))
    assert found, f"{name} no longer says {pattern!r}: update the claim here"
    values = expected()
    assert len(values) == len(found.groups())
    for quoted, value in zip(found.groups(), values, strict=True):
        assert agrees(quoted, value), f"{name} quotes {quoted} in {found.group(0)!r}: {value}"


def test_the_lean_step_stays_within_the_bound_the_pages_quote() -> None:
    bound = max(v.value + v.slack for v in column("training_overhead", "lean / floor"))
    for name, pattern in (
        ("docs/choosing.rst", r"a step within ([\d.]+)x the floor of one masked pass"),
        ("docs/large_models.rst", r"the lean mode is within ([\d.]+) times the floor"),
    ):
        found = re.search(pattern, page(name))
        assert found, f"{name} no longer says {pattern!r}"
        assert bound <= float(found.group(1)), (name, bound)


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_each_quoted_results_table_is_what_its_script_renders_from_the_json(name: str) -> None:
    script, function = RENDERERS[name]
    rendered = getattr(load_script(script), function)(results(name))
    assert rendered.strip() == (RESULTS / f"{name}.md").read_text().strip()


def test_a_quote_agrees_only_within_its_rounding() -> None:
    assert agrees("22.5", Value(22.5, 0.05)) and agrees("8.0", Value(7.95, 0.005))
    assert agrees("7.6", Value(7.55, 0.005)) and agrees("28", Value(28.3, 0.05))
    assert not agrees("17", Value(14.5, 0.05)) and not agrees("38", Value(22.5, 0.05))
    assert not agrees("1.30", Value(1.33, 0.005)) and not agrees("90.00", Value(89.99, 0.005))
