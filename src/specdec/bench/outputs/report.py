"""``summary.json`` (machine-readable, per configuration) and ``report.md`` (a table a person
reads, with the configuration, models, hardware and versions header)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ...core.names import AR
from .results import atomic_write_text


def fmt(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:{spec}}{suffix}"


def pct(x: Any) -> str:
    return fmt(None if x is None else 100 * x, ".1f", "%")


def with_ci(x: Any, ci: Any, spec: str = ".3f", ci_spec: str = ".2f", scale: float = 1.0) -> str:
    """``x [lo, hi]`` (``x`` alone without an interval); values multiplied by ``scale``."""
    cell = fmt(None if x is None else scale * x, spec)
    return cell if not ci or x is None else f"{cell} [{scale * ci[0]:{ci_spec}}, {scale * ci[1]:{ci_spec}}]"


def _p(p: Any) -> str:
    return "–" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _paired_table(rows: dict) -> list[str]:
    """Per configuration: its quality against ar's sample by sample (summary.paired_quality)."""
    paired = {cid: r["paired"] for cid, r in rows.items() if r.get("paired")}
    if not paired:
        return []
    lines = ["", "### Quality against ar, sample by sample", "",
             "| configuration | samples | lost | gained | McNemar p | difference [95% CI] |",
             "|---|---:|---:|---:|---:|---:|"]
    for cid, q in paired.items():
        diff = with_ci(q["difference"], q["difference_ci"], "+.1f", "+.1f", 100)
        lines.append(f"| {cid} | {q['n']} | {q['lost']} | {q['gained']} | {_p(q['mcnemar_p'])} | {diff} pp |")
    return lines


def write_summary(summary: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "summary.json"
    atomic_write_text(path, json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n")
    return path


def render_report(summary: dict) -> str:
    """report.md: the run's settings, the results table, then the tables that apply and the definitions."""
    lines = _header(summary) + _results(summary) + _structured(summary) + _paired_table(summary["configs"])
    for section in (_best_k, _vs_lossless, _by_category, _trees, _curves, _definitions):
        lines += section(summary)
    if summary.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in summary["plots"]]
    return "\n".join(lines) + "\n"


def _header(summary: dict) -> list[str]:
    """The run's command, models, hardware, versions, data and decoding settings."""
    run, env = summary["run"], summary["environment"]
    hw, ver, git = env["hardware"], env["versions"], env["git"]
    models = run["models"]
    lines = [f"# specdec bench: {run['dataset']}", ""]
    lines += [
        f"- **Command**: `specdec {' '.join(env.get('argv') or [])}`"
        + (f" (re-reported: `specdec {' '.join(env['reported_by'])}`)" if env.get("reported_by") else ""),
        f"- **Models**: target `{models['target']}`, draft `{models['draft']}` (quantization: {models['draft_quant']}), "
        f"dtype {models['dtype']}" + (f", draft dtype {models['draft_dtype']}" if models.get("draft_dtype") else "")
        + f", device {models['device']}",
        f"- **Hardware**: {hw['cpu']}"
        + (f" ({hw['cpu_cores']} cores, {hw['torch_threads']} torch threads)" if hw.get("cpu_cores") else "")
        + f"; CPU flags: {', '.join(hw.get('cpu_flags') or []) or 'none of note'}; GPU: {hw['gpu'] or 'none'}",
        f"- **Versions**: python {ver['python'] or '?'}, torch {ver['torch']}, transformers {ver['transformers']}, "
        f"specdec {ver['specdec']}; git {git.get('commit') or 'unknown'}{' (uncommitted changes)' if git.get('dirty') else ''}",
        f"- **Data**: {run['samples']} samples from {run['data_source']}"
        + (f" (partial: the {run['samples']} of {run['samples_planned']} planned that every configuration has "
           f"finished)" if run.get("samples_planned", run["samples"]) > run["samples"] else "")
        + (f"; categories: {', '.join(f'{c} ({n})' for c, n in run['categories'].items())}" if run.get("categories") else "")
        + ("; Spec-Bench: first user turn only" if run["dataset"].startswith("spec-bench") else "")
        + ("; Spec-Bench's extraction questions (first turn) x 2 JSON schemas, every configuration decoding "
           "under each prompt's schema" if run.get("constraint") else ""),
        f"- **Decoding**: max_new_tokens {run['max_new_tokens']}, temperature {run['temperature']}, top_p {run['top_p']}, "
        f"top_k {run['top_k']}, seed {run['seed']}; repeats {run['repeats']} (median time, min–max over repeats); "
        f"warm-up: {'each configuration once, not recorded' if run['warmup'] else 'off'}",
    ]
    return lines


def speed_basis(row: dict) -> str:
    """`` on n/N`` when a row's speed rests on fewer samples than its quality (some were timed at
    another machine speed: :func:`specdec.bench.outputs.summary.same_speed`), else nothing."""
    n, total = row.get("speed_samples"), row.get("samples")
    return f" on {n}/{total}" if n is not None and total and n < total else ""


#: the cell of a speed figure the bench withholds (no sample timed at one machine speed with ar's)
WITHHELD = "withheld"


def time_vs_ar(row: dict) -> str:
    """A row's time against ``ar`` with its bootstrap interval: ``1.23x [1.10, 1.38]``; ``withheld``
    where no sample of it was timed at ``ar``'s machine speed; ``–`` without one."""
    if row.get("speed_withheld"):
        return WITHHELD
    ratio, ci = row.get("time_speedup_vs_ar"), row.get("time_speedup_ci")
    cell = fmt(ratio, ".2f", "x")
    return cell if not ci or ratio is None else f"{cell} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _results(summary: dict) -> list[str]:
    """The main table: one row per configuration (bold: on the speed-quality Pareto front)."""
    rows = summary["configs"]
    lines = ["", "## Results", ""]
    metric = next((r.get("quality_metric") for r in rows.values() if r.get("quality_metric")), None)
    qname = metric or "quality"
    lines.append(f"| configuration | tau | tokens/s (min–max) | speedup vs ar (min–max) | time vs ar [95% CI] (length vs ar) | {qname} | "
                 "recovery [95% CI] | exact match vs ar | token agreement | zero-accept rounds | draft / verify time | lossy |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    front = set(summary.get("pareto_front") or [])
    for cid, r in rows.items():
        ag = r.get("agreement") or {}
        rec = with_ci(r.get("recovery"), (r.get("paired") or {}).get("recovery_ci"))
        tps = f"{fmt(r.get('tokens_per_second'), '.1f')} ({fmt(r.get('tokens_per_second_min'), '.1f')}–{fmt(r.get('tokens_per_second_max'), '.1f')})"
        sp = WITHHELD if r.get("speed_withheld") else \
            f"{fmt(r.get('speedup_vs_ar'), '.2f', 'x')} ({fmt(r.get('speedup_min'), '.2f')}–{fmt(r.get('speedup_max'), '.2f')})"
        tv = f"{time_vs_ar(r)} ({fmt(r.get('length_vs_ar'), '.2f', 'x')})"
        dv = (f"{pct(r.get('draft_share'))} / {pct(r.get('verify_share'))}"
              if r.get("draft_share") is not None else "–")
        name = f"**{cid}**" if cid in front else cid
        if r.get("kind") == "peer":
            policy = str(r.get("policy"))
            name += (" (llama.cpp)" if policy.startswith("llama-cpp") else
                     " (llama.cpp's server, xllamacpp wheel)" if policy.startswith("llama-server") else
                     " (OpenVINO GenAI)" if policy in ("ov", "ov-pld") else " (transformers)")
        lines.append(
            f"| {name} | {fmt(r.get('tau'))} | {tps} | {sp} | {tv} | {pct(r.get('quality'))} | {rec} | "
            f"{pct(ag.get('exact_match'))} | {pct(ag.get('token_agreement'))} | {pct(r.get('zero_accept_share'))} | "
            f"{dv} | {'yes' if r.get('lossy') else 'no'} |"
        )
    lines += ["", "Time vs ar: plain decoding's seconds over this configuration's on the same samples (how much "
              "sooner the same work finishes); it differs from the tokens/s speedup when a rule writes more or "
              "less (length vs ar: its tokens over plain decoding's). Its 95% interval: a percentile bootstrap "
              "over the samples (2000 resamples, seed 0), each resample's ratio of summed seconds; it shows "
              "the samples' spread, not the machine's drift between runs.",
              "", f"Bold: on the speed–quality Pareto front ({', '.join(summary.get('pareto_front') or []) or 'none'})."]
    partly = [f"{cid} on {r['speed_samples']} of {r['samples']}" for cid, r in rows.items()
              if r.get("speed_samples") is not None and r.get("samples") and r["speed_samples"] < r["samples"]]
    if partly:
        lines += ["", "Speed figures on fewer samples than quality (the rest were timed on a machine of another "
                  f"speed than plain decoding's, e.g. a run resumed elsewhere): {'; '.join(partly)}."]
    withheld = [cid for cid, r in rows.items() if r.get("speed_withheld")]
    if withheld:
        lines += ["", f"Withheld: {', '.join(withheld)}: no sample was timed at the machine speed plain decoding "
                  "was (the probe's one-token step differed by more than the tolerance), so no speed figure is "
                  "given; its quality figures stand."]
    return lines


def _structured(summary: dict) -> list[str]:
    """Structured output: per configuration that decoded under a constraint, its validity,
    truncations, speed against plain decoding on the same backend, tau and the mask's cost."""
    rows = {cid: r for cid, r in summary["configs"].items() if r.get("structured")}
    if not rows:
        return []
    lines = ["", "### Structured output (JSON schema)", "",
             "| configuration | valid | truncated | same text as ar | tokens/s | vs ar (same backend) | tau | "
             "mask ms / verify pass | mask share of verify | draft mask ms / pass |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cid, r in rows.items():
        st = r["structured"]
        valid = f"{st['valid']}/{st['n']} ({pct(st['validity'])})"
        vs = fmt(st.get("speedup_vs_ar_same_backend"), ".2f", "x")
        if st.get("vs_ar") not in (None, AR):
            vs += f" (vs {st['vs_ar']})"
        lines.append(f"| {cid} | {valid} | {st['truncated']} | {pct(st.get('same_text_as_ar'))} | "
                     f"{fmt(r.get('tokens_per_second'), '.1f')} | {vs} | {fmt(r.get('tau'))} | "
                     f"{fmt(st.get('mask_ms_per_pass'), '.3f')} | {pct(st.get('mask_share'))} | "
                     f"{fmt(st.get('draft_mask_ms_per_pass'), '.3f')} |")
    return lines


def _best_k(summary: dict) -> list[str]:
    if not summary.get("best_k"):
        return []
    lines = ["", "### Best K per rule and drafter", "", "| rule/drafter | best K | speedup | tau |", "|---|---:|---:|---:|"]
    for name, b in summary["best_k"].items():
        lines.append(f"| {name} | {b['k']} | {fmt(b['speedup_vs_ar'], '.2f', 'x')} | {fmt(b['tau'])} |")
    return lines


def _vs_lossless(summary: dict) -> list[str]:
    rows, lines = summary["configs"], []
    gains = summary.get("vs_lossless")
    if gains is None:  # summaries written before this table existed
        from .summary import vs_lossless
        gains = vs_lossless(rows)
    if gains:
        lines += ["", "### Loose rules vs lossless at the same drafter and K", "",
                  "| configuration | lossless reference | tau gain | speed gain (tokens/s) | time gain | exact match vs ar |",
                  "|---|---|---:|---:|---:|---:|"]
        for cid, g in gains.items():
            tau_gain = "–" if g["tau_ratio"] is None else f"{100 * (g['tau_ratio'] - 1):+.1f}%"
            speed_gain, time_gain = ("–" if g.get(key) is None else f"{100 * (g[key] - 1):+.1f}%"
                                     for key in ("speed_ratio", "time_ratio"))
            lines.append(f"| {cid} | {g['lossless']} | {tau_gain} | {speed_gain} | {time_gain} | "
                         f"{pct((rows[cid].get('agreement') or {}).get('exact_match'))} |")
    return lines


def _by_category(summary: dict) -> list[str]:
    rows, lines = summary["configs"], []
    cats = next((list(r["by_category"]) for r in rows.values() if r.get("by_category")), None)
    if cats:
        lines += ["", "### Speedup vs ar (tau) by category", "",
                  "| configuration | " + " | ".join(cats) + " |", "|---|" + "---:|" * len(cats)]
        for cid, r in rows.items():
            cells = [f"{fmt(r['by_category'][c].get('speedup_vs_ar'), '.2f', 'x')} ({fmt(r['by_category'][c].get('tau'))})"
                     for c in cats]
            lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    return lines


def _trees(summary: dict) -> list[str]:
    rows, lines = summary["configs"], []
    trees = {cid: r["tree"] for cid, r in rows.items() if r.get("tree")}
    if trees:
        lines += ["", "### Token trees", "", "| configuration | tree rounds | nodes per tree | depth | accepted depth |",
                  "|---|---:|---:|---:|---:|"]
        for cid, t in trees.items():
            lines.append(f"| {cid} | {t['rounds']} | {t['mean_nodes']:.1f} | {t['mean_depth']:.1f} | {t['mean_accepted_depth']:.2f} |")
    return lines


def _curves(summary: dict) -> list[str]:
    rows, lines = summary["configs"], []
    curves = {cid: r["per_position_acceptance"] for cid, r in rows.items() if r.get("per_position_acceptance")}
    if curves:
        width = max(len(c) for c in curves.values())
        lines += ["", "### Per-position acceptance (token trees: per depth)", "", "| configuration | " + " | ".join(str(i + 1) for i in range(width)) + " |",
                  "|---|" + "---:|" * width]
        for cid, c in curves.items():
            lines.append(f"| {cid} | " + " | ".join(fmt(x) for x in c) + " |" + " |" * (width - len(c)))
    return lines


def _definitions(summary: dict) -> list[str]:
    """What each column means, and how the peers and ar variants were run."""
    rows, models = summary["configs"], summary["run"]["models"]
    peers = [r for r in rows.values() if r.get("kind") == "peer"]
    lines = ["", "## Definitions", "",
            "- tokens/s: new tokens / wall seconds of the generate call, summed over samples (median over repeats); "
            "speedup vs ar: that ratio against `ar` (plain decoding, same engine) on the same samples, same run.",
            "- tau: 1 + accepted drafts / target verify passes (ar = 1). zero-accept rounds: share of drafting "
            "rounds that kept no draft. draft / verify time: share of engine time.",
            "- recovery: quality / quality of ar on the same samples (pass@1 for HumanEval, final-answer accuracy "
            "for math_reasoning). Agreement: with the ar output of the same sample (exact token ids; matching "
            "positions / longer length).",
            "- Quality against ar, sample by sample (first repeat of each sample): lost = solved by ar and not by "
            "the configuration, gained = the reverse; McNemar p: exact two-sided test of lost vs gained (a small p: "
            "the difference is unlikely to be chance); difference: pass rate minus ar's in percentage points, 95% "
            "interval by Newcombe's paired square-and-add method; the recovery interval is Bonett-Price's for a "
            "ratio of paired proportions. On few samples the intervals are wide: they are what the run can tell.",
            "- The loop runs samples outer and configurations inner (interleaved), their order turned by one "
            "from each sample to the next (plain decoding is not always first), so machine drift hits all alike."]
    if any(r.get("structured") for r in rows.values()):
        lines.append(STRUCTURED_DEFINITION)
    ars = [cid for cid, r in rows.items() if r.get("kind") == "specdec" and r.get("policy") == AR]
    if len(ars) > 1 and summary.get("best_ar"):
        best = summary["best_ar"]
        lines.append(f"- best plain decoding in this run: `{best}`; speedup over it (the slowest of the speedups "
                     "over each ar variant): " + ", ".join(
                         f"{cid} {fmt(r.get('speedup_vs_best_ar'), '.2f', 'x')}" for cid, r in rows.items()
                         if r.get("speedup_vs_best_ar") is not None and cid not in ars) + ".")
    if peers:
        lines.append("- transformers peers run `generate()` on the same prompts with the same model objects "
                     f"(draft quantization {models['draft_quant']}); their tau is measured as generated tokens per "
                     "target forward pass (transformers reports no acceptance counts); hf-assisted uses "
                     "transformers' draft-length defaults unless parameters are given. llama-cpp is plain decoding "
                     "by llama.cpp on the target's GGUF file (its own quantized weights and kernels), tau 1.")
    return lines


STRUCTURED_DEFINITION = (
    "- Structured output: every configuration decodes under each prompt's JSON schema (llguidance's "
    "token masks). valid: outputs that parse (json.loads) and validate against the schema (jsonschema), "
    "of all generations; truncated: cut by max_new_tokens before the JSON closed (counted invalid); same "
    "text as ar: output text equal to ar's for the same sample; vs ar (same backend): tokens/s over "
    "plain decoding on the same backend; mask ms / verify pass: time masking the target's rows "
    "(the engine's mask_seconds) per target verify pass, and its share of verify time; draft mask: the "
    "drafter's grammar work (draft_mask_seconds) per verify pass. – where the engine does not record it.")


def write_report(summary: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.md"
    atomic_write_text(path, render_report(summary))
    return path
