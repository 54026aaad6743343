"""What `bench` leaves behind: a table for people, bench.json with every figure, PNG plots, and a
one-line JSON summary. Plots use matplotlib's object API (no pyplot, no global backend switch);
matplotlib is imported only when plots are asked for.
"""

from __future__ import annotations

import itertools
import json
import os
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..atomic import create_beside, new_file, write_error
from ..errors import LoadError, UsageError
from ..extras import install_hint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Row = dict[str, Any]  # one row of a report (bench.json "rows")

PLOTS = ("speedup.png", "accepted_lengths.png", "acceptance_by_position.png",
         "tokens_per_s_vs_gamma.png", "tokens_per_s_vs_steps.png", "tokens_per_s_vs_batch_size.png")


SHORT = {"gamma": "g={}", "steps": "T={}", "batch_size": "b={}", "temperature": "t={:g}"}  # in a legend


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(report: dict[str, Any]) -> str:
    """One line per row; the [min, max] of tokens/s over rounds only when there were several."""
    spread = report["config"]["repeats"] > 1
    head = f"{'method':30} {'tok/s':>8} " + (f"{'[min, max]':>17} " if spread else "") + \
           f"{'speed-up':>8} {'tau':>5} {'alpha':>5} {'ideal':>6} {'meas/ideal':>10} {'x floor':>7} {'match':>5}"
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        t, match = r["tokens_per_s"], {True: "yes", False: "NO", None: "-"}[r["matches_ar"]]
        low_high = f"[{t['min']:.1f}, {t['max']:.1f}]"
        span = f"{low_high:>17} " if spread else ""
        lines.append(f"{r['label']:30} {t['median']:8.1f} {span}"
                     f"{r['speedup']:7.2f}x {r['tau']:5.2f} {_f(r['alpha'], '5.2f'):>5} "
                     f"{_f(r['ideal']['speedup'], '6.2f'):>6} {_f(r['ideal']['measured_over_ideal'], '10.2f'):>10} "
                     f"{_f(r['roofline']['x_floor'], '7.2f'):>7} {'ref' if _is_reference(r) else match:>5}")
    return "\n".join(lines + _floor_lines(report.get("roofline")) + _invariance_lines(report.get("width_invariance")))


def _is_reference(row: Row) -> bool:
    """ar on eager torch at batch 1: the row every other at its temperature is compared with."""
    return cast(bool, row["method"] == "ar" and row.get("runtime", "torch") == "torch" and row.get("batch_size", 1) == 1)


def _invariance_lines(invariance: dict[str, Any] | None) -> list[str]:
    """Per runtime: how far a wide call's logits are from one-token calls' (tools/invariance.py)."""
    out = []
    for runtime, m in (invariance or {}).items():
        if m is None:
            continue
        verdict = "a greedy token could differ" if m["flip"] else "no greedy flip possible at what was seen"
        out.append(f"width invariance, {runtime}: logits of {'/'.join(map(str, m['widths']))}-token calls within "
                   f"{m['gap']:.2g} of one-token calls; smallest top-2 margin {m['margin']:.2g}: {verdict}")
    return out


def _floor_lines(roofline: dict[str, Any] | None) -> list[str]:
    """What `x floor` divides by: the peaks measured in the run and the floors they give."""
    if roofline is None:
        return []
    floors = ", ".join(f"{w} tokens {_scaled(ms / 1e3, SECONDS)}" for w, ms in roofline["floor_ms"].items())
    return [f"x floor: each row's verify call (ar: decode) over the least it can cost here: "
            f"{_scaled(roofline['weight_bytes'], BYTES)} of weights at "
            f"{_scaled(roofline['read_gb_s'] * 1e9, BYTES, '/s')}, {_scaled(roofline['gflop_s'] * 1e9, FLOPS, '/s')} "
            f"measured -> {floors}"]


BYTES = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
FLOPS = ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1.0, "FLOP"))
SECONDS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


def _scaled(value: float, units: tuple[tuple[float, str], ...], per: str = "") -> str:
    """`value` in the largest of `units` (scale, name; largest first) it holds one of, to 3
    significant digits, `per` after the unit: a small model's 354 kB and 21.4 us, where fixed
    units printed 0 MB and 0.0 ms."""
    rounded = float(f"{value:.3g}")  # 999.96 kB is 1 MB, not 1e+03 kB
    scale, unit = next(((scale, unit) for scale, unit in units if rounded >= scale), units[-1])
    return f"{rounded / scale:.3g} {unit}{per}"


def summary(report: dict[str, Any], out_dir: Path | None = None) -> dict[str, Any]:
    rows, env = report["rows"], report["environment"]
    best, why = best_row(rows)
    return {"bench_json": str(out_dir / "bench.json") if out_dir else None, "device": env["device"],
            "threads": env["threads"], "foreign_cpu_load": env.get("foreign_cpu_load", "unknown"),
            "prompts": report["config"]["prompts"],
            "max_new_tokens": report["config"]["max_new_tokens"], "check": report["check"]["passed"],
            "best": best, "best_reason": why, "unreliable": report["reliability"]["unreliable"],
            "speedup": {r["label"]: round(r["speedup"], 3) for r in rows},
            "tokens_per_s": {r["label"]: round(r["tokens_per_s"]["median"], 2) for r in rows}}


def best_row(rows: list[Row]) -> tuple[str | None, str]:
    """(the row that was the fastest in every round, why) or (None, why none is named). Each round
    compares the rows' speed-ups over ar in that round (`speedup_runs`: ar itself is 1.0), so a row
    is named only when no round saw another row as fast."""
    rounds = len(rows[0]["speedup_runs"])
    leaders = []
    for i in range(rounds):
        top = max(r["speedup_runs"][i] for r in rows)
        leaders.append([r["label"] for r in rows if r["speedup_runs"][i] == top])
    if all(lead == leaders[0] for lead in leaders) and len(leaders[0]) == 1:
        if rounds == 1:
            return leaders[0][0], "the fastest row in the one round (repeats 1: no spread to judge it by)"
        return leaders[0][0], f"faster than every other row in each of the {rounds} rounds"
    seen = "; ".join(f"round {i + 1}: {' = '.join(lead)}" for i, lead in enumerate(leaders))
    return None, f"no row was the fastest in every round ({seen})"


REPORT_FILES = ("bench.json", *PLOTS)


def check_report_dir(out_dir: str | Path) -> None:
    """Refuse, before any work, a report directory that write_report could not write: by doing
    what it will do (make the missing directories, create a file in the last), then undoing it.
    Asking alone let through what only trying tells (/proc/x, /sys/x, a name too long, a link to
    nothing, a directory root may not write, a read-only file system), each a WriteError after the
    whole run; '' (the current directory) and a report file that is a directory are refused too."""
    if not str(out_dir):
        raise UsageError("cannot write the report to '': the path is empty")
    directory = Path(out_dir)
    made: list[Path] = []
    try:
        _make_dirs(directory, out_dir, made)
        fd, probe = create_beside(directory / "bench.json")
        os.close(fd)
        probe.unlink()
        taken = [name for name in REPORT_FILES if (directory / name).is_dir()]
        if taken:
            raise UsageError(f"cannot write the report to {out_dir}: {directory / taken[0]} is a directory")
    except OSError as e:
        raise UsageError(f"cannot write the report to {out_dir}: {e.strerror or e}") from e
    finally:
        for path in reversed(made):
            with suppress(OSError):
                path.rmdir()


def _make_dirs(directory: Path, out_dir: str | Path, made: list[Path]) -> None:
    """Make `directory` and its missing parents, outermost first, each added to `made`."""
    chain = [directory.absolute(), *directory.absolute().parents]
    missing = list(itertools.takewhile(lambda p: not os.path.lexists(p), chain))
    existing = chain[len(missing)]
    if not existing.is_dir():
        what = "a link to nothing" if existing.is_symlink() and not existing.exists() else "not a directory"
        raise UsageError(f"cannot write the report to {out_dir}: {existing} is {what}")
    for path in reversed(missing):
        path.mkdir()
        made.append(path)


def write_report(report: dict[str, Any], out_dir: str | Path, plots: bool = True) -> list[Path]:
    """bench.json and (plots=True) the PNGs that apply, each complete or absent; -> the files written."""
    out_dir = Path(out_dir)
    figure = require_matplotlib() if plots else None
    check_report_dir(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(out_dir, e) from e
    path = out_dir / "bench.json"
    with new_file(path) as tmp:
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    written = [path]
    if figure:
        for name, draw in zip(PLOTS, (_speedup, _lengths, _positions, _vs_gamma, _vs_steps, _vs_batch_size)):
            tall = name == "speedup.png" and len(report["rows"]) > 10  # one bar per row
            fig = figure(figsize=(7.5, 1.5 + 0.3 * len(report["rows"]) if tall else 4.5), layout="constrained")
            if draw(fig.add_subplot(), report["rows"]) is not False:
                with new_file(out_dir / name) as tmp:
                    fig.savefig(tmp, dpi=110, format="png")
                written.append(out_dir / name)
    return written


def require_matplotlib() -> type[Figure]:
    """-> matplotlib's Figure class, or a LoadError that says how to get it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise LoadError(f"plots need matplotlib: {install_hint('bench')}") from e
    return Figure


def _speedup(ax: Axes, rows: list[Row]) -> bool:
    labels = [r["label"] for r in rows][::-1]
    rows = rows[::-1]
    med = [r["speedup"] for r in rows]
    err = [[m - r["speedup_range"][0] for m, r in zip(med, rows)],
           [r["speedup_range"][1] - m for m, r in zip(med, rows)]]
    ax.barh(labels, med, xerr=err, color="tab:blue", alpha=0.8, label="measured (median, min-max)")
    ideal = [(r["ideal"]["speedup"], label) for r, label in zip(rows, labels) if r["ideal"]["speedup"]]
    ax.scatter([i for i, _ in ideal], [label for _, label in ideal], marker="x", color="tab:red", zorder=3,
               label="ideal: tau c_1 / (c_v + n_d c_d)")
    ax.axvline(1.0, color="gray", lw=1, ls="--")
    ax.set_xlabel("speed-up over ar (tokens/s ratio)")
    ax.set_title("Speed-up per method")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8)
    return True


def _ticks_integer(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _drafting(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["per_position_acceptance"]]


def _lengths(ax: Axes, rows: list[Row]) -> bool:
    """True once drawn; False: no row drafts, nothing to plot (the other plots alike)."""
    rows = _drafting(rows)
    if not rows:
        return False
    for r in rows:
        h = r["accepted_length_histogram"]
        ax.plot(range(len(h)), [x / max(sum(h), 1) for x in h], marker="o", label=r["label"])
    _ticks_integer(ax)
    ax.set_xlabel("draft tokens accepted in one verification")
    ax.set_ylabel("fraction of verifications")
    ax.set_title("Accepted-length histogram")
    ax.legend(fontsize=8)
    return True


def _positions(ax: Axes, rows: list[Row]) -> bool:
    rows = _drafting(rows)
    if not rows:
        return False
    for r in rows:
        a = r["per_position_acceptance"]
        ax.plot(range(1, len(a) + 1), a, marker="o", label=r["label"])
    _ticks_integer(ax)
    ax.set_xlabel("draft slot j")
    ax.set_ylabel("P(draft accepted up to slot j)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Per-position acceptance")
    ax.legend(fontsize=8)
    return True


def _series(ax: Axes, rows: list[Row], x_key: str, group_keys: tuple[str, ...], xlabel: str,
            title: str, ar_line: bool = True) -> bool:
    """Median tokens/s (min-max bars) against x_key, one line per group; ar as a dashed line
    (ar_line) or, where ar itself is swept, as its own line."""
    swept = [r for r in rows if r[x_key] is not None]
    if len({r[x_key] for r in swept}) < 2:
        return False
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in swept:
        groups.setdefault(tuple(r[k] for k in group_keys), []).append(r)
    for key, members in groups.items():
        members.sort(key=lambda r: r[x_key])
        t = [r["tokens_per_s"] for r in members]
        ax.errorbar([r[x_key] for r in members], [x["median"] for x in t], capsize=3, marker="o",
                    yerr=[[x["median"] - x["min"] for x in t], [x["max"] - x["median"] for x in t]],
                    label=" ".join(SHORT.get(k, "{}").format(v) for k, v in zip(group_keys, key) if v is not None))
    if ar_line:
        ar = next(r for r in rows if r["method"] == "ar")
        ax.axhline(ar["tokens_per_s"]["median"], color="gray", ls="--", label="ar")
    ax.set_xticks(sorted({r[x_key] for r in swept}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens/s (median, min-max)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return True


def _batch_1(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.get("batch_size", 1) == 1]


def _vs_gamma(ax: Axes, rows: list[Row]) -> bool:
    """Fixed gammas only: a gamma auto row has no place on the axis (it is in the batch-size plot)."""
    fixed = [r for r in _batch_1(rows) if r["method"] == "ar" or isinstance(r["gamma"], int)]
    return _series(ax, fixed, "gamma", ("method", "steps", "schedule"), "gamma (draft length)",
                   "Tokens/s against gamma")


def _vs_steps(ax: Axes, rows: list[Row]) -> bool:
    return _series(ax, _batch_1(rows), "steps", ("gamma", "schedule"),
                   "T (denoising steps per draft)", "Tokens/s against T")


def _vs_batch_size(ax: Axes, rows: list[Row]) -> bool:
    """One line per method, gamma (auto and each fixed one), T and temperature; ar's own line."""
    return _series(ax, rows, "batch_size", ("method", "gamma", "steps", "schedule", "temperature"),
                   "prompts per forward pass", "Tokens/s (all rows) against batch size", ar_line=False)
