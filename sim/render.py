"""Turning query answers into what people read: tables, JSON rows and a plot."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deniable.v1 import deniable_pb2 as pb


def mechanism_name(value: pb.Mechanism.ValueType) -> str:
    """Lower-case wire name of a mechanism enum value."""
    return pb.Mechanism.Name(value).lower()


def privacy_line(privacy: pb.PrivacyStatement) -> str:
    """One sentence stating the guarantee that holds."""
    local = (
        f"local ε0 = {privacy.epsilon0:g} per report"
        if privacy.local_guarantee
        else "no local guarantee (a shuffle-model protocol: each report alone is not private)"
    )
    if not math.isfinite(privacy.central_epsilon):
        reason = privacy.epsilon_unavailable or privacy.note or "no analysis applies"
        batch = privacy.smallest_batch
        return f"{local}; no central guarantee can be stated at the smallest batch ({batch}): {reason}"
    if privacy.amplified:
        central = (
            f"central (ε, δ) = ({privacy.central_epsilon:.4g}, {privacy.delta:.3g})"
            + (" after shuffling" if privacy.local_guarantee else " for the released counts")
            + f" (computed at the smallest batch, {privacy.smallest_batch} devices, of {privacy.batches}"
            + (f"; batch target {privacy.batch_target}" if privacy.batch_target else "")
            + f"; {privacy.analysis})"
        )
        if privacy.evaluated_n:
            central += (
                f", evaluated at n' = {privacy.evaluated_n} < {privacy.smallest_batch}"
                " (valid: the guarantee only improves with n)"
            )
    elif privacy.local_guarantee:
        central = f"no amplification claimed: central ε = ε0 = {privacy.central_epsilon:g}"
        if privacy.note:
            central += f" ({privacy.note})"
    else:
        central = f"no central guarantee stated (central target ε = {privacy.epsilon0:g})"
        if privacy.note:
            central += f" ({privacy.note})"
    return f"{local}; {central}"


def guarantee_words(local_guarantee: bool, epsilon0: float) -> str:
    """Both guarantees of a campaign in a few words: a local epsilon0, or none and a central target."""
    if local_guarantee:
        return f"local ε0 = {epsilon0:g}"
    return f"no local guarantee (shuffle-only; ε0 = {epsilon0:g} is the central target)"


def answer_rows(answer: pb.QueryResponse, truth: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Bucket rows as the demo JSON and ``query --json`` emit them."""
    rows: list[dict[str, Any]] = []
    for index, bucket in enumerate(answer.buckets):
        row: dict[str, Any] = {"label": bucket.label}
        if truth is not None:
            row["true_count"] = int(truth[index])
        row.update(
            raw_count=int(bucket.raw_count),
            estimate=finite(bucket.estimate),
            std_error=finite(bucket.std_error),
            ci_low=finite(bucket.ci_low),
            ci_high=finite(bucket.ci_high),
        )
        if answer.post_processing_applied:
            row.update(processed=bucket.processed, suppressed=bucket.suppressed)
        rows.append(row)
    return rows


def finite(value: float) -> float | None:
    """The value, or None (JSON null) where it is infinite or NaN: strict JSON has neither."""
    return value if math.isfinite(value) else None


def answer_json(answer: pb.QueryResponse, truth: Sequence[int] | None = None) -> dict[str, Any]:
    """A whole query answer as a JSON-ready dict (strict JSON: no Infinity, no NaN)."""
    privacy = answer.privacy
    unavailable = privacy.epsilon_unavailable or (
        "" if math.isfinite(privacy.central_epsilon) else "no finite central epsilon can be stated"
    )
    return {
        "id": answer.campaign_id,
        "mechanism": mechanism_name(answer.mechanism),
        "n": int(answer.n),
        "rejected": int(answer.rejected),
        "confidence": answer.confidence,
        "epsilon0": privacy.epsilon0,
        "local_guarantee": privacy.local_guarantee,
        "local_epsilon": privacy.epsilon0 if privacy.local_guarantee else None,
        "central_epsilon": finite(privacy.central_epsilon),
        "central_epsilon_unavailable": unavailable or None,
        "delta": privacy.delta,
        "smallest_batch": int(privacy.smallest_batch),
        "batches": int(privacy.batches),
        "releases": int(privacy.releases),
        "incomplete_releases": int(privacy.incomplete_releases),
        "batch_target": int(privacy.batch_target),
        "below_n_min_authorised": privacy.below_n_min_authorised,
        "privacy_note": privacy.note,
        "analysis": privacy.analysis,
        "amplified": privacy.amplified,
        "evaluated_n": int(privacy.evaluated_n) or None,
        "simultaneous": answer.simultaneous,
        "post_processing_applied": list(answer.post_processing_applied),
        "buckets": answer_rows(answer, truth),
        "manipulation": manipulation_json(answer),
    }


def manipulation_json(answer: pb.QueryResponse) -> dict[str, Any]:
    """The poisoning bound: per bucket, how far m fake well-formed reports could move the estimate."""
    budget = answer.manipulation
    out: dict[str, Any] = {"fake_reports": int(budget.fake_reports), "rule": budget.rule}
    out["computed"] = budget.computed
    if not budget.computed:
        out["note"] = budget.note
        return out
    out["buckets"] = [
        {
            "label": bucket.label,
            "max_raise": budget.max_raise[i],
            "max_lower": budget.max_lower[i],
            "max_raise_per_report": budget.raise_per_report[i],
            "max_lower_per_report": budget.lower_per_report[i],
        }
        for i, bucket in enumerate(answer.buckets)
    ]
    return out


def manipulation_line(answer: pb.QueryResponse) -> str:
    """One line: how far m fake reports could move the estimates (the largest over buckets)."""
    budget = answer.manipulation
    m = int(budget.fake_reports)
    if not budget.computed:
        return f"manipulation: {m} fake reports: {budget.note or 'bound not derived'}"
    up, down = max(budget.max_raise, default=0.0), max(budget.max_lower, default=0.0)
    caveat = f"; {budget.note.split(';')[0]}" if budget.note else ""
    return (
        f"manipulation: {m} fake well-formed reports ({budget.rule.split(' (')[0]}) could raise an"
        f" estimate by up to {up:.1f} or lower it by up to {down:.1f} (per bucket in --json){caveat}"
    )


def answer_table(answer: pb.QueryResponse, truth: Sequence[int] | None = None) -> str:
    """A fixed-width table: bucket, (true count,) estimate, std error, confidence interval."""
    level = f"{answer.confidence * 100:g}% {'simultaneous ' if answer.simultaneous else ''}CI"
    processed = bool(answer.post_processing_applied)
    header = ["bucket", *(["true"] if truth is not None else []), "raw", "estimate", "std err", level]
    header += ["processed"] if processed else []
    lines = []
    for index, bucket in enumerate(answer.buckets):
        cells = [bucket.label]
        if truth is not None:
            inside = bucket.ci_low <= truth[index] <= bucket.ci_high
            cells.append(f"{truth[index]}{'' if inside else ' *'}")
        cells += [
            str(bucket.raw_count),
            f"{bucket.estimate:.1f}",
            f"{bucket.std_error:.1f}",
            f"[{bucket.ci_low:.1f}, {bucket.ci_high:.1f}]",
        ]
        if processed:
            cells.append("suppressed" if bucket.suppressed else f"{bucket.processed:.1f}")
        lines.append(cells)
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    out = [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *lines]
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    if processed:
        out.append("post-processed (free of privacy cost): " + " → ".join(answer.post_processing_applied))
    return "\n".join(out)


def plot_answers(answers: Sequence[tuple[str, pb.QueryResponse, Sequence[int]]], path: Path) -> None:
    """PNG: per campaign, true counts as bars and estimates with their CIs as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(answers), figsize=(6 * len(answers), 4.5), squeeze=False)
    for axis, (title, answer, truth) in zip(axes[0], answers, strict=True):
        labels = [b.label for b in answer.buckets]
        xs = list(range(len(labels)))
        estimates = [b.estimate for b in answer.buckets]
        lower = [b.estimate - b.ci_low for b in answer.buckets]
        upper = [b.ci_high - b.estimate for b in answer.buckets]
        axis.bar(xs, truth, color="#c9d6e8", label="true count")
        axis.errorbar(
            xs,
            estimates,
            yerr=[lower, upper],
            fmt="o",
            color="#b2182b",
            capsize=4,
            label=f"estimate, {answer.confidence * 100:g}% CI",
        )
        axis.set_xticks(xs, labels, rotation=30 if len(labels) > 4 else 0)
        privacy = answer.privacy
        axis.set_title(
            f"{title}\nn = {answer.n}, ε0 = {privacy.epsilon0:g}, central ε = {privacy.central_epsilon:.3g},"
            f" δ = {privacy.delta:.0e}",
            fontsize=10,
        )
        axis.set_ylabel("reports")
        top = max([*truth, *(b.ci_high for b in answer.buckets)])
        axis.set_ylim(0, top * 1.15)
        axis.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def strict(data: Any) -> Any:
    """``data`` with every infinite or NaN float replaced by None: JSON has no Infinity or NaN."""
    if isinstance(data, float):
        return finite(data)
    if isinstance(data, dict):
        return {key: strict(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [strict(value) for value in data]
    return data


def dumps(data: Any) -> str:
    """Strict, indented JSON (``allow_nan=False`` after ``strict``): what every CLI writes."""
    return json.dumps(strict(data), indent=2, allow_nan=False)


def write_json(data: Any, path: Path | None) -> None:
    """Strict, indented JSON at ``path`` (if any; folders made), and a line saying so."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(data) + "\n")
        print(f"wrote {path}")
