"""Pictures of a run: time per step against PyTorch eager and torch.compile (a table for
gr.LinePlot), and a roofline placing the final kernel (an SVG: log-log axes, no plotting library
needed)."""
from __future__ import annotations

import math
from html import escape

import pandas as pd

from mtmc.kernels.spec import KernelSpec
from mtmc.tools.estimate import roofline
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
