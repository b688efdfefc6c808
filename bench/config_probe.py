"""Time chosen configs of specs given in words, beside PyTorch eager: the quick answer to "would
this knob pay here?" before a rule or the policy is changed.

  python -m bench.config_probe "l2 normalize each row of a 32768 x 65535 float32 tensor" \
      --set SPLIT=1,4,16 --set num_warps=8,16 [--name STEM]

Per request: the family's default config for this GPU, then every combination of the --set
values over it (an illegal one is recorded with the family's reason).  Each config is checked
against float64 truth on the same inputs and timed by do_bench (bench.collect_workers.SpecBench:
what the policy's dataset uses); eager PyTorch is timed on the same inputs.  Rows are saved as
they come (bench.record.Results).
"""
from __future__ import annotations

import argparse
import itertools
import json

from bench.record import Results, add_output_args, gpu_profile, markdown_table, run_meta


def parse_sets(items: list[str]) -> dict[str, list]:
    """["SPLIT=1,4", "PERSISTENT=true"] -> {"SPLIT": [1, 4], "PERSISTENT": [True]} (JSON values)."""
    out = {}
    for item in items:
        knob, _, values = item.partition("=")
        out[knob] = [json.loads(v.lower() if v in ("True", "False") else v) for v in values.split(",")]
    return out


def configs(default: dict, sets: dict[str, list]) -> list[dict]:
    """The default, then each combination of the --set values over it (no repeats)."""
    out = [dict(default)]
    for combo in itertools.product(*sets.values()):
        cfg = {**default, **dict(zip(sets, combo))}
        if cfg not in out:
            out.append(cfg)
    return out


def eager_ms(bench, dims: dict) -> float:
    from mtmc.tools.timing import bench_ms
    xs, _, _ = bench.inputs(dims)
    fn = bench.ns["reference"]
    return bench_ms(lambda: fn(*xs))


def probe(text: str, sets: dict[str, list], hw, add) -> None:
    from bench.collect_workers import SpecBench
    from mtmc.kernels import catalog
    from mtmc.request.parse import parse_request
    spec = parse_request(text).spec
    if spec is None:
        add({"request": text, "error": "not parsed"})
        return
    fam = catalog.family_of(spec)
    bench = SpecBench(spec.to_dict(), "cuda", 25, 100)
    base = {"request": text, "spec": spec.to_dict()}
    add({**base, "config": "eager", "ms": eager_ms(bench, spec.dims)})
    for i, cfg in enumerate(configs(fam.default_config(spec, hw), sets)):
        row = {**base, "config": cfg, "default": i == 0}
        try:
            source = fam.render(spec, cfg)
        except ValueError as e:
            add({**row, "error": f"illegal: {e}"[:300]})
            continue
        got = bench.measure(source, spec.dims)
        add({**row, "ms": got["ms"], "stage": got["stage"], "error": got["error"]})
        if got.get("poisoned"):
            break


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requests", nargs="+", help="specs in words, as `mtmc generate` takes them")
    p.add_argument("--set", action="append", default=[], help="KNOB=v1,v2,... (JSON values); repeat per knob")
    add_output_args(p)
    args = p.parse_args(argv)
    hw = gpu_profile("config_probe")
    if hw is None:
        return 2
    table = lambda rows: markdown_table(rows, COLUMNS)  # noqa: E731
    results = Results(args.out, args.name, "config-probe", "Chosen configs vs PyTorch eager", table, run_meta())
    rows: list[dict] = []
    for text in args.requests:
        probe(text, parse_sets(args.set), hw, lambda row: results.add(rows, [row]))
    return 0


COLUMNS = [("request", "request"), ("config", lambda r: json.dumps(r.get("config")) if r.get("config") else "-"),
           ("ms", "ms", ".4f"), ("stage", "stage"), ("error", "error")]


if __name__ == "__main__":
    raise SystemExit(main())
