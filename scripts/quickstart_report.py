"""What scripts/quickstart.sh prints after its `specdiff bench` run: each question with plain
decoding's answer and the fastest exact drafting row's beside it, bench's table, and a last line
in words.

    python scripts/quickstart_report.py BENCH_JSON TABLE_TXT

The last line says whether any configuration was faster than plain decoding with torch (`ar`, the
reference) in every timed round: "faster by X (low-high over N rounds) with CONFIG", else "not
faster here"; what the drafter did against plain decoding on the same runtime; and whether every
greedy answer was plain decoding's, token for token. Only rows whose greedy answers matched count.
"""

from __future__ import annotations

import json
import statistics
import sys
import textwrap
from typing import Any

Row = dict[str, Any]
RUNTIMES = {"torch": "torch", "onnxruntime": "ONNX Runtime"}


def describe(row: Row) -> str:
    """'specdiff g=4 T=1 l2r onnxruntime' -> 'specdiff (gamma 4, T=1) on ONNX Runtime'; a tree row
    'dflash (gamma 4, tree auto) on ONNX Runtime'."""
    runtime = RUNTIMES.get(row["runtime"], row["runtime"])
    if row["method"] == "ar":
        return f"plain decoding (ar) on {runtime}"
    what = [f"gamma {row['gamma']}"]
    if row.get("steps") is not None:
        what.append(f"T={row['steps']}")
    if row.get("tree"):
        what.append(f"tree {row['tree']}")
    return f"{row['method']} ({', '.join(what)}) on {runtime}"


def fastest(rows: list[Row], drafting: bool = True) -> Row | None:
    """The row after the reference (rows[0]) with the highest speed-up whose greedy answers were
    plain decoding's; drafting: among the drafting rows only (not `ar` on another runtime)."""
    exact = (r for r in rows[1:] if r["matches_ar"] and not (drafting and r["method"] == "ar"))
    return max(exact, key=lambda r: r["speedup"], default=None)


def answers(rows: list[Row], questions: list[str]) -> list[str]:
    """Each question, plain decoding's answer (torch) and the fastest exact drafting row's."""
    ar = rows[0]
    other = fastest(rows)
    lines = []
    for i, question in enumerate(questions):
        lines.append(textwrap.shorten(f">>> {question}", 100, placeholder=" ..."))
        shown = [("plain decoding", ar)] + ([(describe(other), other)] if other else [])
        for who, row in shown:
            same = " (identical, token for token)" if row is not ar and row["matches_ar"] else ""
            text = " ".join(row["texts"][i].split())
            lines.append(textwrap.fill(f"{who}{same}: {text}", 100, subsequent_indent="    "))
        lines.append("")
    return lines


def ratio(row: Row, over: Row) -> tuple[float, float, float]:
    """(median, low, high) over the rounds of row's tokens/s over `over`'s in the same round."""
    runs = [a / b for a, b in zip(row["speedup_runs"], over["speedup_runs"])]
    return statistics.median(runs), min(runs), max(runs)


def drafter_note(rows: list[Row]) -> str:
    """What each drafting row did beside plain decoding on its own runtime, in words."""
    parts = []
    for row in rows:
        ar = next((r for r in rows if r["method"] == "ar" and r["runtime"] == row["runtime"]), None)
        if row["method"] != "ar" and ar is not None:
            mid, low, high = ratio(row, ar)
            parts.append(f"{describe(row)} {mid:.2f}x ({low:.2f}-{high:.2f})")
    return "; the drafters alone (over ar on the same runtime): " + ", ".join(parts) if parts else ""


def verdict(report: dict[str, Any]) -> str:
    rows, check = report["rows"], report["check"]["passed"]
    rounds = len(rows[0]["speedup_runs"])
    best = fastest(rows, drafting=False)
    if best is not None and min(best["speedup_runs"]) > 1.0:
        low, high = min(best["speedup_runs"]), max(best["speedup_runs"])
        speed = (f"faster than plain decoding with torch by {best['speedup']:.2f}x ({low:.2f}-{high:.2f}x over "
                 f"{rounds} rounds) with {describe(best)}")
    else:
        speed = "not faster here: no configuration beat plain decoding with torch in every round"
    same = {True: "greedy identical", False: "greedy answers DIFFER from plain decoding (a bug: the MISMATCH "
            "lines above say where)", None: "greedy not checked"}[check]
    return f"Result: {speed}{drafter_note(rows)}; {same}."


def main(bench_json: str, table_txt: str) -> None:
    with open(bench_json, encoding="utf-8") as f:
        report = json.load(f)
    print("\n".join(answers(report["rows"], report["prompt_texts"])))
    with open(table_txt, encoding="utf-8") as f:
        print("".join(line for line in f if not line.startswith("{")))  # not bench's JSON summary
    load = report["environment"].get("foreign_cpu_load")
    if isinstance(load, float) and load > 0.25:
        print(f"(Other processes kept {load:.2f} CPU cores busy during the timing: speeds are lower and "
              "noisier than on a quiet machine.)")
    print(verdict(report))


if __name__ == "__main__":
    main(*sys.argv[1:3])
