"""Helpers several test files share (tests/ is on sys.path under pytest: `import kernel_helpers`).

  template_kernels(groups)  each module group's family template at its default config
  compile_defaults(specs)   sm_90 resource reports of each spec's default config
  compile_configs(items)    sm_90 resource reports of given (spec, config) pairs
  assert_groups_compile(groups)  each module group's default kernel compiles for sm_90, in limits
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import resolve

ROOT = Path(__file__).resolve().parents[1]


def template_kernels(groups) -> dict:
    """Each group's family template at its default config (what the loop's step 0 verifies)."""
    kernels = {}
    for g in groups:
        spec = KernelSpec.from_dict(g.spec)
        fam = family_of(spec)
        cfg = fam.default_config(spec, resolve("h200"))
        kernels[g.id] = {"source": fam.render(spec, cfg), "config": cfg}
    return kernels


COMPILE_CHILD = """
import json, sys
from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import PROFILES
from mtmc.kernels.task import compile_resources
h200 = PROFILES["h200"]
out = {}
for name, item in json.loads(sys.stdin.read()).items():
    spec = KernelSpec.from_dict(item["spec"])
    family = family_of(spec)
    cfg = item["config"] or family.default_config(spec, h200)
    source = family.render(spec, cfg)
    if name.endswith("index64"):   # the 64-bit offsets of tensors past 2**31 elements
        source = source.replace("INDEX_64 = max(", "INDEX_64 = True or max(")
    out[name] = compile_resources(source, spec, family.check_dims(spec, cfg), h200).to_dict()
print(json.dumps(out))
"""


def compile_defaults(specs: dict) -> dict:
    """Resource reports of each spec's default config for sm_90, from one child with the
    interpreter off (this process's Triton may be the interpreter's)."""
    return compile_configs({name: (d, None) for name, d in specs.items()})


def compile_configs(items: dict) -> dict:
    """name -> (spec dict, config or None for the default): sm_90 resource reports, as above."""
    items = {name: {"spec": d, "config": cfg} for name, (d, cfg) in items.items()}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", COMPILE_CHILD], input=json.dumps(items), capture_output=True,
                          text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_groups_compile(groups) -> None:
    """Each module group's kernel at its default config compiles for sm_90 with no error and no
    resource limit broken (one child for all of them)."""
    reports = compile_defaults({f"group {g.id} ({g.spec['op']})": g.spec for g in groups})
    for name, report in reports.items():
        errors = [f"{k['name']}: {k['error']}" for k in report["kernels"] if k["error"]]
        assert report["kernels"] and not errors, f"{name}: {errors}"
        assert report["violations"] == [], f"{name}: {report['violations']}"
