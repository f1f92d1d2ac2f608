"""The chart of a bench/pps.py run, drawn from its JSON alone.

Drawn from the saved JSON (never from live state) so that a chart can be
redrawn, after a change to this file, without measuring again
(`bench/pps.py --redraw PREFIX.json`). Bars are the median of the repeats,
whiskers the lowest and highest repeat (each repeat's own summary, so the
whiskers are real runs, not a symmetric guess around the median).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Colours that stay apart in grey print and for the common colour blindnesses.
COLOURS = ("#4477aa", "#ee6677", "#228833")
PANEL_HEIGHT = 3.9
DPI = 110
WRAP = 165  # characters per line of the title and the notes (8-point type)

Summarize = Callable[[dict], dict]

# What pyvmm's rows are, by their mode (bench/pps.py's --modes; s5ring-MODE).
PATHS = {
    ("off",): "off = one hypercall (one VM exit) per frame, answered in C",
    ("off-py",): "off-py = the same answered in Python",
    ("poll", "event", "hybrid"): "poll, event, hybrid = shared-memory rings served by "
    "pyvmm's IO thread",
    ("s5ring",): "s5ring-* = a guest built with Solo5's own ring I/O, served by pyvmm",
}


def thousands(value: float, _pos=None) -> str:
    """An axis label in readable units: 700k, 1.2M, 950."""
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def short(value: float | None) -> str:
    """A bar's value printed above it, three significant digits."""
    if value is None:
        return ""
    for scale, unit in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


class Runs:
    """One table's rows (``kind``: rx, tx or latency) from the JSON: the
    medians of the summary and each repeat's own summary for the whiskers."""

    def __init__(self, raw: dict, kind: str, summarize: Summarize):
        self.kind = kind
        self.raw_runs: dict[str, list] = raw.get(kind) or {}
        summary_kind = "latency" if kind == "latency" else kind
        self.rows = {r["mode"]: r for r in raw["summary"].get(summary_kind) or []}
        self.per_run: dict[str, list[dict]] = {}
        for mode, runs in self.raw_runs.items():
            try:
                self.per_run[mode] = [summarize(r) for r in runs]
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                self.per_run[mode] = []  # an older JSON: medians without whiskers

    def value(self, mode: str, key: str) -> float | None:
        v = self.rows.get(mode, {}).get(key)
        return None if v is None else float(v)

    def whisker(self, mode: str, key: str) -> tuple[float, float]:
        """How far the lowest and the highest repeat lie below and above the median."""
        med = self.value(mode, key)
        vals = [s.get(key) for s in self.per_run.get(mode, [])]
        vals = [float(v) for v in vals if v is not None]
        if med is None or not vals:
            return 0.0, 0.0
        return max(med - min(vals), 0.0), max(max(vals) - med, 0.0)

    def missing(self, mode: str, case: dict) -> str:
        """Why a row has no bars here ('' when it has)."""
        if mode in self.rows:
            return ""
        if mode in self.raw_runs:
            return "every run failed"
        if self.kind != "rx" and case and "tx_guest" not in case:
            return "not run:\nreceive-only guest"
        return "not run"


def modes_of(raw: dict) -> list[str]:
    """Every row of any table, in the order the run had them."""
    out: list[str] = []
    for kind in ("rx", "tx", "latency"):
        for r in raw["summary"].get(kind) or []:
            if r["mode"] not in out:
                out.append(r["mode"])
    return out


def case_of(raw: dict, mode: str) -> dict:
    for kind in ("rx", "tx", "latency"):
        runs = (raw.get(kind) or {}).get(mode) or []
        if runs:
            return runs[0].get("case") or {}
    return {}


def emulated(raw: dict, mode: str) -> bool:
    """A peer tender (solo5-hvt) on a kvm_pvm host: its guest runs at CPL 0,
    which kvm_pvm executes in KVM's instruction emulator (docs/pvm.md)."""
    return raw["machine"].get("kvm") == "pvm" and case_of(raw, mode).get("tender") == "peer"


def title_lines(raw: dict) -> list[str]:
    m, a = raw["machine"], raw["args"]
    date = str(raw.get("started", "")).replace("T", " ")[:16]
    load = m.get("loadavg") or [0.0]
    rate = a.get("rate", "0")
    offered = "as fast as the sender can" if rate in ("0", "") else f"{rate} datagrams/s"
    runs = a.get("repeat", "?")
    head = f"pyvmm network paths side by side (bench/pps.py{', ' + date if date else ''})"
    host = (
        f"host: {m.get('arch')}, {m.get('cpus')} CPUs ({m.get('cpu_model')}), "
        f"kernel {m.get('kernel')}, KVM flavour {m.get('kvm')}, load {load[0]:.2f} at the start"
    )
    work = (
        f"{a.get('size')}-byte UDP payloads, {float(a.get('seconds', 0)):g} s of traffic per row, "
        f"offered {offered} (sender: {a.get('sender')}"
        f"{', pinned' if a.get('pin') == 'True' else ''}); "
        + (
            "one run per row (no spread)"
            if runs == "1"
            else f"bars: median of {runs} runs per row, whiskers: lowest and highest run"
        )
    )
    return [head, *textwrap.wrap(host, WRAP), *textwrap.wrap(work, WRAP)]


def notes(raw: dict, modes: list[str]) -> list[str]:
    out = []
    if "process" in modes:
        out.append(
            "process: the same guest programs as one plain Linux process on the tap, no VM "
            "(the baseline)."
        )
    pyvmm = [m for m in modes if case_of(raw, m).get("tender") == "pyvmm"]
    if pyvmm:
        # A label is MODE, MODE-BUDGETus (hybrid's sweep) or either /CPL.
        bases = {re.sub(r"(-\d+us)?(/.*)?$", "", m) for m in pyvmm}
        bases |= {"s5ring" for b in bases if b.startswith("s5ring-")}
        named = [text for names, text in PATHS.items() if bases & set(names)]
        out.append("pyvmm's paths: " + "; ".join(named) + ".")
        out.append(
            "KVM exits per 1000 frames come from pyvmm's own counters: none for process "
            "(no VM) or another tender."
        )
    peers = [m for m in modes if emulated(raw, m)]
    if peers:
        out.append(
            f"{', '.join(peers)} (emulated): on this host (kvm_pvm) KVM runs its guest's "
            "kernel-mode code in its instruction emulator, about 1000x slower than hardware "
            "would: these rows measure the emulator, not the tender. Its transmit and "
            f"latency runs are 1/{raw['args'].get('peer_scale', '100')} as long."
        )
    return [line for note in out for line in textwrap.wrap(note, WRAP)]


def tick_labels(raw: dict, modes: list[str]) -> list[str]:
    return [m + ("\n(emulated)" if emulated(raw, m) else "") for m in modes]


def grouped_bars(
    ax, raw: dict, runs: Runs, modes: list[str], bars: list[tuple[str, str]], shown: str
) -> None:
    """Bars per row (``bars``: key, legend label), with whiskers; the value
    of bar ``shown`` printed above it, so that a bar too short to see still
    reads; a row without data says why."""
    x = np.arange(len(modes))
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        offset = (i - (len(bars) - 1) / 2) * width
        vals = [runs.value(m, key) for m in modes]
        low_high = np.array([runs.whisker(m, key) for m in modes]).T
        ax.bar(
            x + offset,
            [v if v is not None else 0 for v in vals],
            width,
            yerr=low_high,
            label=label,
            color=COLOURS[i % len(COLOURS)],
            error_kw={"elinewidth": 0.9, "capsize": 2},
        )
    at = [key for key, _ in bars].index(shown)
    for xi, m in zip(x, modes, strict=True):
        why = runs.missing(m, case_of(raw, m))
        if why:
            ax.annotate(
                why,
                (xi, 0.04),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=7,
                color="0.35",
            )
            continue
        v = runs.value(m, shown)
        top = (v or 0) + runs.whisker(m, shown)[1]
        ax.annotate(
            short(v),
            (xi + (at - (len(bars) - 1) / 2) * width, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )


def axis_setup(ax, raw: dict, modes: list[str], title: str, ylabel: str) -> None:
    ax.set_xticks(np.arange(len(modes)), tick_labels(raw, modes), fontsize=8)
    ax.set_xlim(-0.6, len(modes) - 0.4)
    ax.set_title(title, fontsize=9.5, loc="left")
    ax.set_ylabel(ylabel, fontsize=8.5)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)


def receive_panel(ax, raw: dict, runs: Runs, modes: list[str]) -> None:
    from matplotlib.ticker import FuncFormatter

    grouped_bars(
        ax,
        raw,
        runs,
        modes,
        [
            ("offered", "offered by the sender"),
            ("tap_pps", "delivered by the tap"),
            ("received", "received by the guest"),
        ],
        "received",
    )
    axis_setup(
        ax,
        raw,
        modes,
        "Receive: UDP frames per second into the guest (higher is better)",
        "frames/s",
    )
    ax.yaxis.set_major_formatter(FuncFormatter(thousands))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)  # room for the legend above the bars
    exits = [runs.value(m, "exits_per_kframe") for m in modes]
    handles, labels = ax.get_legend_handles_labels()
    if any(e for e in exits):
        ax2 = ax.twinx()
        x = np.arange(len(modes))
        ex = np.array([e if e else np.nan for e in exits])
        marker = ax2.plot(
            x + 0.4 * 2 / 3,
            ex,
            "kD",
            markersize=4.5,
            label="KVM exits per 1000 frames (right, log; lower is better)",
        )
        ax2.set_yscale("log")
        ax2.set_ylim(1, max(np.nanmax(ex) * 20, 10))
        ax2.set_ylabel("KVM exits per 1000 frames (log)", fontsize=8.5)
        ax2.tick_params(axis="y", labelsize=8)
        handles += marker
        labels.append(marker[0].get_label())
    ax.legend(handles, labels, loc="upper center", ncol=2, fontsize=7.5, frameon=False)


def transmit_panel(ax, raw: dict, runs: Runs, modes: list[str]) -> None:
    from matplotlib.ticker import FuncFormatter

    grouped_bars(
        ax,
        raw,
        runs,
        modes,
        [("guest_pps", "sent by the guest"), ("host_pps", "received by a host socket")],
        "host_pps",
    )
    axis_setup(
        ax,
        raw,
        modes,
        "Transmit: UDP frames per second out of the guest to a host socket (higher is better)",
        "frames/s",
    )
    ax.yaxis.set_major_formatter(FuncFormatter(thousands))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.legend(loc="upper center", ncol=2, fontsize=7.5, frameon=False)


def latency_panel(ax, raw: dict, runs: Runs, modes: list[str]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    grouped_bars(
        ax,
        raw,
        runs,
        modes,
        [("median_us", "median"), ("p99_us", "99th percentile"), ("max_us", "maximum")],
        "median_us",
    )
    axis_setup(
        ax,
        raw,
        modes,
        "Latency: 64-byte UDP request/response round trip, one outstanding (lower is better)",
        "round trip, µs (log scale)",
    )
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(
        FuncFormatter(lambda v, _p: thousands(v) if v >= 1e4 else f"{v:g}")
    )
    ax.yaxis.set_minor_formatter(NullFormatter())
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 2.5)
    ax.legend(loc="upper left", ncol=3, fontsize=7.5, frameon=False)


def figure(raw: dict, summarizers: dict[str, Summarize]):
    """The chart of ``raw`` (a bench/pps.py JSON) as a matplotlib figure
    (Agg); raises KeyError, TypeError or ValueError on a JSON of another shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = modes_of(raw)
    panels = [
        (draw, Runs(raw, kind, summarizers[kind]))
        for kind, draw in (
            ("rx", receive_panel),
            ("tx", transmit_panel),
            ("latency", latency_panel),
        )
        if raw["summary"].get(kind)
    ]
    if not panels:
        raise ValueError("the JSON has no rows to draw")
    head, foot = title_lines(raw), notes(raw, modes)
    fig = plt.figure(
        figsize=(11, PANEL_HEIGHT * len(panels) + 0.2 * (len(head) + len(foot)) + 0.4),
        layout="constrained",
    )
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (draw, runs) in zip(axes, panels, strict=True):
        draw(ax, raw, runs, modes)
    fig.suptitle(head[0], fontsize=11.5, fontweight="bold")
    axes[0].annotate(
        "\n".join(head[1:]),
        (0, 1),
        xycoords="axes fraction",
        xytext=(0, 22),
        textcoords="offset points",
        fontsize=8,
        va="bottom",
        annotation_clip=False,
    )
    if foot:
        fig.supxlabel("\n".join(foot), fontsize=7.5, x=0.01, ha="left", color="0.25")
    return fig


def chart(path: Path, raw: dict, summarizers: dict[str, Summarize]) -> str | None:
    """Draw ``raw`` (a bench/pps.py JSON) to ``path``; None when drawn, else
    why not (one line)."""
    try:
        import matplotlib  # noqa: F401 (only: is it there)
    except ImportError:
        return "matplotlib is not installed: no chart (pip install matplotlib)"
    try:
        fig = figure(raw, summarizers)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return f"cannot draw: not a bench/pps.py result ({type(err).__name__}: {err})"
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as err:
        return f"cannot write {path}: {err.strerror or err}"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return None
