"""The learned cost model: log(ms) and validity of (spec, config, hw), from measured records.

What Ansor and TVM MetaSchedule do: a small network over the features (policy.features) is
fitted to the dataset's measured times, and the policy is trained inside it (policy.env).
  * target: log(ms / roofline ideal ms) of the `ok` records with a time; the ideal is always
    defined and scale-free, so the network learns how far from the roofline a config lands (the
    resource model's own estimate is one of its inputs);
  * loss: Huber on that target plus the same on its within-spec centred values (what ranks the
    configs of one spec, the thing the planner needs), and a validity head (binary cross entropy:
    ok vs compile_error / wrong / timeout / masked) over every record;
  * an ensemble of a few members fitted on bootstrap resamples of the specs: their spread is the
    model's uncertainty, which the environment charges for (a policy must not learn to exploit
    one member's mistakes);
  * compiled resources are dropped from half the training rows, so the model predicts both with
    a compile report (the dataset, the current draft) and without (a candidate config).
Evaluation (`rank_metrics`): per held-out spec, Spearman's rank correlation between predicted
and measured times, and the regret of the predicted-best config.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import torch
from torch import nn

from mtmc.kernels.spec import KernelSpec
from mtmc.policy.features import Layout, feature_size, features, spec_vector
from mtmc.tools.hardware import PROFILES, HardwareProfile, get_profile

INVALID_STAGES = ("compile_error", "wrong", "timeout", "masked")


@dataclass
class CostConfig:
    hidden: int = 192
    layers: int = 3
    members: int = 3
    epochs: int = 60
    specs_per_batch: int = 16
    lr: float = 2e-3
    weight_decay: float = 1e-4
    rank_weight: float = 1.0
    valid_weight: float = 0.3
    resource_dropout: float = 0.5
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def profile_of(record: dict) -> HardwareProfile:
    """The hardware profile a record was measured with ("h200" as bench.collect names it)."""
    return PROFILES.get(record.get("gpu")) or get_profile(record.get("device_name") or record["gpu"])


class CostNet(nn.Module):
    def __init__(self, n_in: int, hidden: int, layers: int):
        super().__init__()
        mods, width = [], n_in
        for _ in range(layers):
            mods += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        self.trunk = nn.Sequential(*mods)
        self.head = nn.Linear(hidden, 2)   # log(ms / ideal), validity logit

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.trunk(x))
        return out[..., 0], out[..., 1]


@dataclass
class Table:
    """Feature rows of a list of records, with their targets."""
    x: torch.Tensor          # [n, d]
    y: torch.Tensor          # [n] log(ms / ideal), nan where no time
    valid: torch.Tensor      # [n] 1 ok, 0 invalid
    spec_ix: torch.Tensor    # [n] index into `specs`
    log_ideal: torch.Tensor  # [n]
    specs: list[str]
    has_res: torch.Tensor    # [n] compiled resources present


def table(records: list[dict], layout: Layout, with_resources: bool = True) -> Table:
    """Features of every record (records the layout cannot read, an unknown family, are skipped)."""
    xs, ys, valid, six, ideal, res = [], [], [], [], [], []
    spec_ids: dict[str, int] = {}
    spec_vecs: dict[str, list] = {}
    for r in records:
        if r["family"] not in layout.families or r["stage"] not in INVALID_STAGES + ("ok",):
            continue
        if r["stage"] == "ok" and r.get("ms") is None:
            continue   # compiled and correct but untimed (the interpreter's rows): no target
        spec, hw = KernelSpec.from_dict(r["spec"]), profile_of(r)
        key = f"{r['spec_key']}@{r['gpu']}"
        if key not in spec_vecs:
            spec_vecs[key] = spec_vector(spec, hw, layout)
            spec_ids[key] = len(spec_ids)
        resources = r.get("resources") if with_resources else None
        v, est = features(spec, r["config"], hw, layout, resources, spec_vecs[key])
        xs.append(v)
        ideal_ms = est.get("ideal_ms") or 1e-6
        ys.append(math.log(r["ms"] / ideal_ms) if r["stage"] == "ok" else math.nan)
        valid.append(1.0 if r["stage"] == "ok" else 0.0)
        six.append(spec_ids[key])
        ideal.append(math.log(ideal_ms))
        res.append(bool(resources and resources.get("regs") is not None))
    d = feature_size(layout)
    return Table(torch.tensor(xs, dtype=torch.float32).reshape(-1, d), torch.tensor(ys, dtype=torch.float32),
                 torch.tensor(valid), torch.tensor(six, dtype=torch.long), torch.tensor(ideal, dtype=torch.float32),
                 list(spec_ids), torch.tensor(res))


# where the compiled-resource features sit in a row (the last five of the model part)
def _resource_slice(layout: Layout) -> slice:
    end = feature_size(layout)
    return slice(end - 5, end)


class CostModel:
    """The fitted ensemble with its layout and input normalization; `predict` is what the
    environment and the planner call."""

    def __init__(self, layout: Layout, nets: list[CostNet], mean: torch.Tensor, std: torch.Tensor, cfg: CostConfig):
        self.layout, self.nets, self.mean, self.std, self.cfg = layout, nets, mean, std, cfg
        for n in nets:
            n.eval()

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    @torch.no_grad()
    def predict_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean log(ms/ideal), its spread over members, validity probability) per row."""
        xn = self._norm(x)
        outs = [n(xn) for n in self.nets]
        t = torch.stack([o[0] for o in outs]).clamp(*PRED_RANGE)
        p = torch.stack([torch.sigmoid(o[1]) for o in outs]).mean(0)
        return t.mean(0), (t.std(0) if len(outs) > 1 else torch.zeros_like(t[0])), p

    def predict(self, spec: KernelSpec, configs: list[dict], hw: HardwareProfile,
                resources: list[dict | None] | None = None) -> list[dict]:
        """Per config: {"ms" (predicted), "log_ms", "std" (log units), "p_valid", "estimate" (the
        resource model's: its "ms" None where it rules the config out)}."""
        if not configs:
            return []
        sv = spec_vector(spec, hw, self.layout)
        rows, ests = [], []
        for i, cfg in enumerate(configs):
            v, est = features(spec, cfg, hw, self.layout, (resources or [None] * len(configs))[i], sv)
            rows.append(v)
            ests.append(est)
        t, s, p = self.predict_rows(torch.tensor(rows, dtype=torch.float32))
        out = []
        for i, est in enumerate(ests):
            log_ms = float(t[i]) + math.log(est.get("ideal_ms") or 1e-6)
            out.append({"ms": math.exp(log_ms), "log_ms": log_ms, "std": float(s[i]), "p_valid": float(p[i]),
                        "estimate": est})
        return out

    # -- checkpoint -------------------------------------------------------------------------
    def state(self) -> dict:
        return {"layout": self.layout.to_dict(), "cfg": self.cfg.to_dict(), "mean": self.mean, "std": self.std,
                "nets": [n.state_dict() for n in self.nets]}

    @classmethod
    def from_state(cls, st: dict) -> "CostModel":
        layout, cfg = Layout.from_dict(st["layout"]), CostConfig(**st["cfg"])
        nets = []
        for sd in st["nets"]:
            n = CostNet(feature_size(layout), cfg.hidden, cfg.layers)
            n.load_state_dict(sd)
            nets.append(n)
        return cls(layout, nets, st["mean"], st["std"], cfg)


def safe_std(x: torch.Tensor) -> torch.Tensor:
    """Per-column std for input normalization, 1 where a column (nearly) never varies in training:
    dividing by a tiny std would blow up the one row at planning time where it does vary (an op
    only the held-out specs have)."""
    std = x.std(0) if len(x) > 1 else torch.ones(x.shape[1])
    return torch.where(std < 0.05, torch.ones_like(std), std)


# log(ms / ideal) is kept in this range at prediction: the roofline ideal is a lower bound, and a
# time e^12 times above it is no kernel anyone would keep; outside the data the net may say anything
PRED_RANGE = (-1.0, 12.0)


def _centred(v: torch.Tensor, ix: torch.Tensor, n: int) -> torch.Tensor:
    """v minus the mean of v over its spec (ix), per row."""
    sums = torch.zeros(n).index_add_(0, ix, v)
    counts = torch.zeros(n).index_add_(0, ix, torch.ones_like(v)).clamp(min=1)
    return v - (sums / counts)[ix]


def _fit_member(tab: Table, mean, std, cfg: CostConfig, layout: Layout, member: int,
                log=None) -> tuple[CostNet, list[float]]:
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + member)
    rng = random.Random(cfg.seed * 1000 + member)
    with torch.random.fork_rng():   # seeded init without touching the caller's global RNG
        torch.manual_seed(cfg.seed * 1000 + member)
        net = CostNet(tab.x.shape[1], cfg.hidden, cfg.layers)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    n_specs = len(tab.specs)
    # a bootstrap resample of the specs (member 0 sees each once: the ensemble's anchor)
    specs = list(range(n_specs)) if member == 0 else [rng.randrange(n_specs) for _ in range(n_specs)]
    rows_of = [torch.nonzero(tab.spec_ix == i).flatten() for i in range(n_specs)]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    rs = _resource_slice(layout)
    losses = []
    for epoch in range(cfg.epochs):
        rng.shuffle(specs)
        total, batches = 0.0, 0
        for b in range(0, len(specs), cfg.specs_per_batch):
            group = specs[b:b + cfg.specs_per_batch]
            ix = torch.cat([rows_of[i] for i in group])
            # rows repeated by the bootstrap get their own spec slots for the centring
            local = torch.cat([torch.full((len(rows_of[i]),), j, dtype=torch.long) for j, i in enumerate(group)])
            x = tab.x[ix].clone()
            drop = torch.rand(len(ix), generator=gen) < cfg.resource_dropout
            x[drop, rs] = 0.0
            pred_t, logit = net((x - mean) / std)
            y, ok = tab.y[ix], tab.valid[ix] > 0.5
            loss = cfg.valid_weight * nn.functional.binary_cross_entropy_with_logits(logit, tab.valid[ix])
            if ok.any():
                loss = loss + nn.functional.huber_loss(pred_t[ok], y[ok], delta=1.0)
                c_pred = _centred(pred_t[ok], local[ok], len(group))
                c_y = _centred(y[ok], local[ok], len(group))
                loss = loss + cfg.rank_weight * nn.functional.huber_loss(c_pred, c_y, delta=1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, batches = total + float(loss.detach()), batches + 1
        sched.step()
        losses.append(total / max(1, batches))
        if log and (epoch % 10 == 0 or epoch == cfg.epochs - 1):
            log(f"  cost model member {member}: epoch {epoch + 1}/{cfg.epochs} loss {losses[-1]:.4f}")
    net.eval()
    return net, losses


def train_cost_model(records: list[dict], layout: Layout, cfg: CostConfig = CostConfig(),
                     log=None) -> tuple[CostModel, dict]:
    """Fit the ensemble on `records` (the caller passes the training split); returns the model
    and {"losses": per member per epoch, "rows", "specs"}."""
    tab = table(records, layout)
    if not len(tab.y) or not bool((tab.valid > 0.5).any()):
        raise ValueError("no timed ok records to fit a cost model on")
    mean, std = tab.x.mean(0), safe_std(tab.x)
    nets, losses = [], []
    for m in range(cfg.members):
        net, ls = _fit_member(tab, mean, std, cfg, layout, m, log)
        nets.append(net)
        losses.append(ls)
    return CostModel(layout, nets, mean, std, cfg), {"losses": losses, "rows": len(tab.y), "specs": len(tab.specs)}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / va if va > 0 else 0.0


def rank_metrics(model: CostModel, records: list[dict], with_resources: bool = False) -> dict:
    """Per spec with >= 3 timed configs: Spearman of predicted vs measured ms, and the regret
    (measured ms of the predicted-best / the best measured - 1); means overall and per family.
    Without resources by default: the planner ranks candidates it has not compiled."""
    tab = table(records, model.layout, with_resources)
    if not len(tab.y):
        return {"specs": 0}
    t, _, p = model.predict_rows(tab.x)
    fam_of = {f"{r['spec_key']}@{r['gpu']}": r["family"] for r in records}
    per: dict[str, list] = {}
    valid_acc = float(((p > 0.5).float() == tab.valid).float().mean())
    for i, key in enumerate(tab.specs):
        rows = torch.nonzero((tab.spec_ix == i) & (tab.valid > 0.5)).flatten()
        if len(rows) < 3:
            continue
        pred = (t[rows] + tab.log_ideal[rows]).tolist()
        true = (tab.y[rows] + tab.log_ideal[rows]).tolist()
        best = min(true)
        pick = true[min(range(len(pred)), key=pred.__getitem__)]
        per.setdefault(fam_of[key], []).append((spearman(pred, true), math.exp(pick - best) - 1.0))
    allv = [x for v in per.values() for x in v]
    if not allv:
        return {"specs": 0, "validity_accuracy": valid_acc}
    return {"specs": len(allv), "spearman": sum(a for a, _ in allv) / len(allv),
            "top1_regret_median": sorted(b for _, b in allv)[len(allv) // 2],
            "validity_accuracy": valid_acc,
            "per_family": {f: {"specs": len(v), "spearman": round(sum(a for a, _ in v) / len(v), 4),
                               "top1_regret_mean": round(sum(b for _, b in v) / len(v), 4)}
                           for f, v in sorted(per.items())}}



def leave_one_out(records: list[dict], layout: Layout, cfg: CostConfig, max_specs: int = 12) -> dict:
    """rank_metrics of each spec (up to max_specs) by a one-member model fitted on all the other
    specs' rows: the held-out estimate when the held-out specs themselves are trained on."""
    keys = sorted({r["spec_key"] for r in records})[:max_specs]
    one = CostConfig(**{**cfg.to_dict(), "members": 1})
    per = []
    for k in keys:
        rest = [r for r in records if r["spec_key"] != k]
        mine = [r for r in records if r["spec_key"] == k]
        try:
            model, _ = train_cost_model(rest, layout, one)
        except ValueError:   # nothing else to fit on
            continue
        m = rank_metrics(model, mine)
        if m.get("specs"):
            per.append({"spec_key": k, "family": mine[0]["family"], "spearman": m["spearman"],
                        "top1_regret": m["top1_regret_median"]})
    if not per:
        return {"specs": 0}
    return {"specs": len(per), "spearman": sum(p["spearman"] for p in per) / len(per),
            "top1_regret_median": sorted(p["top1_regret"] for p in per)[len(per) // 2], "per_spec": per}
