"""Pictures of a run, as SVG (no plotting library needed): time per step against PyTorch eager
and torch.compile (one line per series, a dot per step, so one step shows too; whole-step ticks,
rounded labels on a linear axis), and a roofline placing the final kernel (log-log axes)."""
from __future__ import annotations

import math
from html import escape

import pandas as pd

from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.estimate import roofline
from mtmc.tools.hardware import HardwareProfile

TIME_COLUMNS = ["step", "ms", "series"]


def time_table(records: list[dict], baselines: dict | None, label: str = "kernel") -> pd.DataFrame:
    """One row per verified step (and per step for each baseline), for a line plot.  The
    baselines are only timed on a GPU; without one the plot shows the estimates alone."""
    rows = []
    for rec in records:
        v = rec.get("verdict") or {}
        t = rec.get("time_ms")
        if v.get("ok") and isinstance(t, (int, float)) and math.isfinite(t):
            rows.append((rec["step"], t, f"{label} (measured)" if v.get("measured") else f"{label} (estimate, no GPU)"))
    steps = sorted({r[0] for r in rows})
    for key, name in (("eager_ms", "PyTorch eager"), ("compile_ms", "torch.compile")):
        ms = (baselines or {}).get(key)
        if isinstance(ms, (int, float)) and ms > 0:
            rows += [(s, ms, name if label == "kernel" else f"{label}: {name}") for s in steps]
    return pd.DataFrame(rows, columns=TIME_COLUMNS)


TIMES_PLACEHOLDER = "<p class=\"mtmc-times-empty\">Time per step appears as the steps are verified.</p>"
TIMES_NOTE = "PyTorch eager and torch.compile are timed on a GPU only."
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
TW, TH, T_LEFT, T_RIGHT, T_TOP, T_BOTTOM = 640, 300, 70, 20, 30, 50


def nice_ticks(lo: float, hi: float, most: int = 6) -> tuple[list[float], int]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 x 10^k) and the decimals their
    labels need."""
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / (most - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [round(i * step, decimals) for i in range(first, last + 1)], decimals


def time_svg(table: pd.DataFrame, note: str = TIMES_NOTE) -> str:
    """The time-per-step table (time_table) as a line plot: one line per series, a dot per step."""
    if table is None or table.empty:
        return TIMES_PLACEHOLDER
    series = list(dict.fromkeys(table["series"]))
    steps = sorted({int(s) for s in table["step"]})
    values = [float(v) for v in table["ms"]]
    y_ticks, decimals = nice_ticks(min(values), max(values))
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    x_lo, x_hi = steps[0] - 0.5, steps[-1] + 0.5
    stride = max(1, math.ceil(len(range(steps[0], steps[-1] + 1)) / 12))
    x_ticks = list(range(steps[0], steps[-1] + 1, stride))

    def sx(x):
        return T_LEFT + (x - x_lo) / (x_hi - x_lo) * (TW - T_LEFT - T_RIGHT)

    def sy(y):
        return TH - T_BOTTOM - (y - y_lo) / (y_hi - y_lo) * (TH - T_TOP - T_BOTTOM)

    height = TH + 18 * len(series) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {TW} {height}" width="100%" '
           f'style="max-width:{TW}px;font-family:sans-serif;font-size:11px" class="mtmc-times">',
           f'<text x="{T_LEFT}" y="18" font-size="13">Time per step (ms)</text>',
           f'<rect x="{T_LEFT}" y="{T_TOP}" width="{TW - T_LEFT - T_RIGHT}" height="{TH - T_TOP - T_BOTTOM}" '
           'fill="none" stroke="#bbb"/>']
    for t in y_ticks:
        out.append(f'<line x1="{T_LEFT}" y1="{sy(t):.1f}" x2="{TW - T_RIGHT}" y2="{sy(t):.1f}" stroke="#eee"/>'
                   f'<text class="y-tick" x="{T_LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.{decimals}f}</text>')
    for t in x_ticks:
        out.append(f'<text class="x-tick" x="{sx(t):.1f}" y="{TH - T_BOTTOM + 16}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{(T_LEFT + TW - T_RIGHT) / 2}" y="{TH - T_BOTTOM + 34}" text-anchor="middle">step</text>'
               f'<text transform="translate(16,{(T_TOP + TH - T_BOTTOM) / 2}) rotate(-90)" text-anchor="middle">ms</text>')
    for i, name in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        rows = sorted((int(r.step), float(r.ms)) for r in table[table["series"] == name].itertuples())
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in rows)
        out.append(f'<g class="series" data-series="{escape(name)}">'
                   f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}" data-step="{x}" data-ms="{y:.6g}">'
                f'<title>{escape(name)}, step {x}: {y:.4g} ms</title></circle>' for x, y in rows]
        legend_y = TH + 18 * i
        out.append(f'</g><line x1="{T_LEFT}" y1="{legend_y - 4}" x2="{T_LEFT + 18}" y2="{legend_y - 4}" '
                   f'stroke="{colour}" stroke-width="3"/><text class="legend" x="{T_LEFT + 24}" y="{legend_y}">'
                   f'{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out) + (f'<p style="font-size:12px;margin:0">{escape(note)}</p>' if note else "")


def kernel_point(spec: dict, time_ms: float, profile: HardwareProfile, measured: bool, name: str = "final kernel") -> dict:
    """Where a kernel of `time_ms` sits under the roofline of `profile`."""
    roof = roofline(KernelSpec.from_dict(spec), profile)
    seconds = time_ms * 1e-3
    return {"name": name, "intensity": roof["intensity"], "tflops": roof["flops"] / seconds / 1e12,
            "gbs": roof["bytes"] / seconds / 1e9, "roof": roof, "measured": measured,
            "of_roof": roof["ideal_ms"] / time_ms}


# -- the SVG ---------------------------------------------------------------------------------
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 400, 70, 20, 30, 70


def roofline_svg(points: list[dict], profile: HardwareProfile) -> str:
    """Log-log roofline of `profile` (bandwidth slope up to the ridge, then the peak) with the
    kernels' points."""
    if not points:
        return "<p>No kernel yet: the roofline appears when a run finishes.</p>"
    bw = profile.bandwidth_gbs
    # one flat roof per peak the kernels can reach (tensor cores for fp16/bf16 matmul, else fp32)
    peaks = sorted({p["roof"]["peak_tflops"] for p in points}, reverse=True)
    ridges = [peak * 1e12 / (bw * 1e9) for peak in peaks]
    xs = [p["intensity"] for p in points] + ridges
    x_lo, x_hi = 10 ** math.floor(math.log10(min(xs) / 4)), 10 ** math.ceil(math.log10(max(xs) * 4))
    ys = [p["tflops"] for p in points] + peaks + [bw * 1e9 * x_lo / 1e12]
    y_lo, y_hi = 10 ** math.floor(math.log10(max(min(ys), 1e-6))), 10 ** math.ceil(math.log10(max(ys) * 2))

    def sx(x):
        return PAD_L + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (W - PAD_L - PAD_R)

    def sy(y):
        y = max(y, y_lo)
        return H - PAD_B - (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * (H - PAD_T - PAD_B)

    height = H + 16 * len(points)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="100%" '
           f'style="max-width:{W}px;font-family:sans-serif;font-size:11px" class="mtmc-roofline">',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" fill="none" stroke="#bbb"/>']
    for decade in _decades(x_lo, x_hi):
        out.append(f'<line x1="{sx(decade):.1f}" y1="{H - PAD_B}" x2="{sx(decade):.1f}" y2="{PAD_T}" stroke="#eee"/>'
                   f'<text x="{sx(decade):.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{decade:g}</text>')
    for decade in _decades(y_lo, y_hi):
        out.append(f'<line x1="{PAD_L}" y1="{sy(decade):.1f}" x2="{W - PAD_R}" y2="{sy(decade):.1f}" stroke="#eee"/>'
                   f'<text x="{PAD_L - 6}" y="{sy(decade) + 4:.1f}" text-anchor="end">{decade:g}</text>')
    for i, (peak, ridge) in enumerate(zip(peaks, ridges)):
        roof_pts = [(x_lo, bw * 1e9 * x_lo / 1e12), (ridge, peak), (x_hi, peak)]
        dash = ' stroke-dasharray="6 4"' if i else ""
        out.append(f'<polyline fill="none" stroke="#444" stroke-width="2"{dash} points="'
                   + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in roof_pts) + '"/>')
    out.append(f'<text x="{PAD_L}" y="18">roofline of {escape(profile.name)}: '
               + " / ".join(f"{peak:g}" for peak in peaks) + f' TFLOP/s, {bw:g} GB/s, ridge at '
               + " / ".join(f"{r:.0f}" for r in ridges) + ' FLOP/B</text>')
    for i, p in enumerate(points):
        colour = "#d62728" if p["measured"] else "#ff7f0e"
        kind = "measured" if p["measured"] else "estimate, no GPU"
        x, y = sx(p["intensity"]), sy(p["tflops"])
        right_half = x > (PAD_L + W - PAD_R) / 2
        tag = p["name"] if len(points) == 1 else str(i + 1)   # numbers keep close points legible
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{colour}"><title>{escape(p["name"])}</title></circle>'
                   f'<text x="{x + (-9 if right_half else 9):.1f}" y="{y + 4:.1f}" '
                   f'text-anchor="{"end" if right_half else "start"}">{escape(tag)}</text>'
                   f'<text x="{PAD_L}" y="{H - PAD_B + 48 + 16 * i}"><tspan fill="{colour}">●</tspan> '
                   f'{"" if len(points) == 1 else tag + ". "}{escape(p["name"])}: {p["tflops"]:.3g} TFLOP/s, {p["gbs"]:.0f} GB/s, '
                   f'{100 * p["of_roof"]:.0f}% of the roof ({kind})</text>')
    out.append(f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - PAD_B + 30}" text-anchor="middle">arithmetic intensity (FLOP / byte, log)</text>'
               f'<text transform="translate(16,{(PAD_T + H - PAD_B) / 2}) rotate(-90)" text-anchor="middle">TFLOP/s (log)</text>'
               "</svg>")
    return "".join(out)


def _decades(lo: float, hi: float) -> list[float]:
    return [10.0 ** e for e in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
