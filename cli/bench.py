"""`rcswarm bench diag`: train small models on a diagnostic task on this machine and compare them.

    rcswarm bench diag --task maze --models lstm transformer:small+n_layers=1 sum \\
        --budget-minutes 6 --task-arg p_withheld=0.2 --task-arg exact_depth=true

Each model (`name[:preset][+field=value...]`, a registered model with `vocab_size` and
`num_classes` fields) trains with AdamW on fresh batches of the task for an equal share of
the wall-clock budget (or `--max-steps`), then is evaluated on held-out examples (the eval
config is the task config updated by `--eval-arg`). The output directory gets results.json,
results.md (accuracy by the task's depth or length), accuracy.png, and one RUN.toml per model
that trains the same job on a swarm with `rcswarm run`. The flags, the models, the task's
config and `--group-by` are checked before any model trains; a results directory that cannot
be written is one line naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rcswarm.cli.usage import new_parser, output_dir_problem, parse_or_status, usage_error
from rcswarm.config.runspec import MAX_LR, MIN_LR, RunSpec
from rcswarm.data.diagnostics import TASKS, Batch, DiagnosticTask, make_task
from rcswarm.models import registry
from rcswarm.train.inner import train_step

# What "accuracy by ..." groups on, per task (a key of the task's meta or position_meta).
DEFAULT_GROUP = {"frjt": "depth", "maze": "depth", "mqar": "distance", "s5": "length"}
EVAL_SEED = 2**30


@dataclass(frozen=True)
class ModelChoice:
    name: str
    preset: str
    overrides: dict[str, Any]

    @property
    def slug(self) -> str:
        """The label as a file name: `transformer-small-n_layers-2`."""
        return "".join(c if c.isalnum() or c in "_." else "-" for c in self.label.replace("+", "-").replace("=", "-"))

    @property
    def label(self) -> str:
        extra = "".join(f"+{k}={v}" for k, v in self.overrides.items())
        return f"{self.name}:{self.preset}{extra}"


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, booleans, lists), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: list[str], flag: str) -> dict[str, Any]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        result[key] = parse_value(value)
    return result


def parse_model(text: str) -> ModelChoice:
    """`name[:preset][+field=value...]`, e.g. `transformer:small+n_layers=2`."""
    head, *assignments = text.split("+")
    name, _, preset = head.partition(":")
    entry = registry.get(name)
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    if "num_classes" not in fields:
        raise ValueError(f"model {name!r} has no num_classes field; diagnostic tasks need one (try {registry.list_models()})")
    preset = preset or ("small" if "small" in entry.presets else next(iter(entry.presets)))
    return ModelChoice(name, preset, parse_assignments(assignments, f"model {text!r}"))


def build(choice: ModelChoice, task: DiagnosticTask, seed: int) -> torch.nn.Module:
    overrides = {"vocab_size": task.vocab.vocab_size, "num_classes": task.vocab.num_classes, **choice.overrides}
    return registry.build_model(choice.name, choice.preset, overrides, seed=seed)


def check_models_take(choices: list[ModelChoice], tasks: dict[str, DiagnosticTask], args: argparse.Namespace) -> None:
    """Every model, before any trains, runs a batch of each task ("training", "evaluation"): a model that cannot
    take the task's sequences (a transformer's max_len below the maze's positions) is a ValueError naming it, where
    it once failed after the models before it had trained their share of the budget."""
    for choice in choices:
        model = build(choice, tasks["training"], args.seed)
        for what, task in tasks.items():
            tokens = task.batch(args.batch_size, seed=args.seed).tokens  # [B, T]
            try:
                with torch.no_grad():
                    model(tokens)
            except (ValueError, RuntimeError, IndexError) as exc:
                raise ValueError(f"model {choice.label} cannot take the {what} task's sequences ({tuple(tokens.shape)}"
                                 f" tokens): {exc}; change the model's config (+field=value) or the task's") from None


def train(model: torch.nn.Module, task: DiagnosticTask, args: argparse.Namespace, seconds: float, progress: Progress, label: str) -> dict[str, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    job = progress.add_task(label, total=args.max_steps or None, info="")
    started = time.monotonic()
    losses: list[float] = []
    step = 0
    model.train()
    while (args.max_steps and step < args.max_steps) or (not args.max_steps and time.monotonic() - started < seconds):
        batch = task.batch(args.batch_size, seed=args.seed * 1_000_003 + step)
        losses.append(train_step(model, optimizer, batch.tokens, batch.targets, grad_clip=1.0))  # tokens, targets [B, T]
        step += 1
        recent = sum(losses[-20:]) / len(losses[-20:])
        progress.update(job, advance=1, info=f"step {step}  loss {recent:.3f}")
    progress.update(job, info=f"{step} steps  loss {sum(losses[-20:]) / max(len(losses[-20:]), 1):.3f}")
    return {"steps": step, "seconds": time.monotonic() - started, "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1)}


def check_group_key(task: DiagnosticTask, key: str) -> None:
    """`--group-by`'s key, before any model trains: `group_values`'s ValueError when one batch of the task (the
    evaluation's) has no such metadata, where it once came only in `evaluate`, after the first model had trained its
    share of the budget."""
    group_values(task.batch(1, seed=EVAL_SEED), key)


def group_values(batch: Batch, key: str) -> torch.Tensor:
    """The grouping value of every position [B, T], from position_meta or per-example meta."""
    if key in batch.position_meta:
        return batch.position_meta[key]
    if key in batch.meta:
        return batch.meta[key][:, None].expand_as(batch.tokens)
    known = sorted(set(batch.meta) | set(batch.position_meta))
    raise ValueError(f"--group-by {key!r}: this task's metadata has {known}")


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: DiagnosticTask, args: argparse.Namespace, key: str) -> dict[str, Any]:
    """Token accuracy over scored positions, overall and by group; sequence accuracy by group."""
    model.eval()
    correct_by: dict[int, list[int]] = {}
    sequences_by: dict[int, list[int]] = {}
    for index in range(math.ceil(args.eval_examples / args.batch_size)):
        batch = task.batch(args.batch_size, seed=EVAL_SEED + index)
        predictions = model(batch.tokens).argmax(-1)  # [B, T]
        hits = (predictions == batch.targets) & batch.mask  # [B, T]
        groups = group_values(batch, key) // args.bucket * args.bucket  # [B, T], bucket starts
        for value in groups[batch.mask].unique().tolist():
            where = batch.mask & (groups == value)
            tally = correct_by.setdefault(int(value), [0, 0])
            tally[0] += int(hits[where].sum())
            tally[1] += int(where.sum())
        example_group = groups.masked_fill(~batch.mask, -1).max(dim=1).values  # [B]
        whole = (hits | ~batch.mask).all(dim=1)  # [B]
        for value, ok in zip(example_group.tolist(), whole.tolist(), strict=True):
            tally = sequences_by.setdefault(int(value), [0, 0])
            tally[0] += int(ok)
            tally[1] += 1
    total_hits = sum(h for h, _ in correct_by.values())
    total = sum(n for _, n in correct_by.values())
    return {
        "token_accuracy": total_hits / max(total, 1),
        "by_group": {str(k): h / n for k, (h, n) in sorted(correct_by.items())},
        "sequence_accuracy_by_group": {str(k): h / n for k, (h, n) in sorted(sequences_by.items())},
        "scored_positions": total,
    }


def write_plot(results: list[dict[str, Any]], key: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for result in results:
        groups = sorted(result["eval"]["by_group"], key=int)
        axis.plot([int(g) for g in groups], [result["eval"]["by_group"][g] for g in groups], marker="o", label=result["model"])
    axis.set_xlabel(key)
    axis.set_ylabel("token accuracy")
    axis.set_ylim(0, 1.02)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown_table(results: list[dict[str, Any]], key: str) -> str:
    groups = sorted({g for r in results for g in r["eval"]["by_group"]}, key=int)
    lines = ["| model | params | steps | all | " + " | ".join(f"{key}={g}" for g in groups) + " |"]
    lines.append("|" + " --- |" * (4 + len(groups)))
    for r in results:
        cells = [f"{r['eval']['by_group'].get(g, float('nan')):.3f}" for g in groups]
        lines.append(f"| {r['model']} | {r['params']:,} | {r['train']['steps']} | {r['eval']['token_accuracy']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def swarm_config(choice: ModelChoice, task_name: str, task_config: dict[str, Any], task: DiagnosticTask, args: argparse.Namespace) -> str:
    """The run config of `rcswarm bench diag --swarm-config`: the task and model trained on a swarm; its data.seq_len
    (for a diagnostic task, the scored positions of one sequence, `scored_per_example`) at least the task's."""
    from rcswarm.train.inner import scored_per_example

    overrides = {"vocab_size": task.vocab.vocab_size, "num_classes": task.vocab.num_classes, **choice.overrides}
    raw = {
        "run": {"name": f"diag-{task_name}-{choice.name}", "seed": args.seed, "rounds": 50},
        "model": {"name": choice.name, "preset": choice.preset, "overrides": overrides},
        "data": {"source": "diag", "task": task_name, "task_config": task_config, "batch_size": args.batch_size},
        "inner": {"lr": args.lr, "steps": 20},
    }
    scored, _ = scored_per_example(RunSpec.from_dict(raw).data, task)
    raw["data"]["seq_len"] = max(RunSpec.from_dict(raw).data.seq_len, scored)
    return RunSpec.from_dict(raw).to_toml()


def model_names() -> str:
    """Every registered model with its presets, for help texts."""
    from rcswarm.models import registry

    return "; ".join(f"{name} ({', '.join(registry.get(name).presets)})" for name in registry.list_models())


def parser() -> argparse.ArgumentParser:
    parser = new_parser("rcswarm bench diag", "Compare models on a diagnostic task.")
    parser.add_argument("--task", required=True, choices=sorted(TASKS), help=f"diagnostic task: {', '.join(sorted(TASKS))}")
    parser.add_argument("--models", nargs="+", required=True,
                        help=f"name[:preset][+field=value...] for each model; models (presets): {model_names()}")
    parser.add_argument("--budget-minutes", type=float, default=5.0, help="wall-clock training budget, shared equally")
    parser.add_argument("--max-steps", type=int, default=0, help="train each model this many steps instead of by time")
    parser.add_argument("--task-arg", action="append", default=[], help="KEY=VALUE of the task config (repeatable)")
    parser.add_argument("--eval-arg", action="append", default=[], help="KEY=VALUE overriding the config for evaluation")
    parser.add_argument("--group-by", default=None, help="metadata key for the accuracy table (default per task)")
    parser.add_argument("--bucket", type=int, default=1, help="group values into buckets of this width (by their start)")
    parser.add_argument("--batch-size", type=int, default=32, help="training batch size")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--eval-examples", type=int, default=512, help="held-out examples per model")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models and the data")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: runs/diag-<task>-<time>)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace | int:
    """The arguments, or the exit status after --help (0) or a usage error (2)."""
    parser_ = parser()
    args = parse_or_status(parser_, argv)
    if isinstance(args, int):
        return args
    if not math.isfinite(args.budget_minutes) or min(args.budget_minutes, args.batch_size, args.eval_examples, args.bucket) <= 0 \
            or args.max_steps < 0:
        parser_.error("--budget-minutes, --batch-size, --eval-examples and --bucket must be positive, --max-steps >= 0")
    if args.threads < 0:
        parser_.error(f"--threads {args.threads}: expected an integer >= 0 (0 = torch's default)")
    problem = lr_problem(args.lr) or seed_problem(args.seed)
    if problem is not None:
        return usage_error("rcswarm bench diag", problem)
    problem = output_dir_problem("--out", args.out) if args.out is not None else None
    if problem is not None:
        parser_.error(problem)
    return args


def lr_problem(lr: float) -> str | None:
    """Why `--lr` cannot be trained with nor written to the models' RUN.toml (inner.lr: MIN_LR to MAX_LR), or None;
    torch refused a negative or NaN one only once training began, naming no flag."""
    if not MIN_LR <= lr <= MAX_LR:
        return f"--lr {lr!r}: expected a learning rate between {MIN_LR:g} and {MAX_LR:g}"
    return None


def seed_problem(seed: int) -> str | None:
    """Why `--seed` cannot seed the models, the data and the RUN.toml's run.seed (0 to 2**63 − 1), or None."""
    if not 0 <= seed < 2**63:
        return f"--seed {seed}: expected an integer between 0 and {2**63 - 1}"
    return None


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    task_config = parse_assignments(args.task_arg, "--task-arg")
    task = make_task(args.task, **task_config)
    eval_task = make_task(args.task, **{**task_config, **parse_assignments(args.eval_arg, "--eval-arg")})
    key = args.group_by or DEFAULT_GROUP[args.task]
    check_group_key(eval_task, key)
    choices = [parse_model(text) for text in args.models]
    check_models_take(choices, {"training": task, "evaluation": eval_task}, args)
    out = args.out or Path("runs") / f"diag-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    (out / "swarm").mkdir(parents=True, exist_ok=True)
    seconds = args.budget_minutes * 60.0 / len(choices)
    results = []
    columns = [TextColumn("{task.description:<36}"), BarColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        for choice in choices:
            model = build(choice, task, args.seed)
            trained = train(model, task, args, seconds, progress, choice.label)
            results.append({
                "model": choice.label, "params": registry.parameter_count(model), "train": trained,
                "eval": evaluate(model, eval_task, args, key),
            })
            (out / "swarm" / f"{choice.slug}.toml").write_text(swarm_config(choice, args.task, task_config, task, args))
    report = {
        "task": args.task, "task_config": task_config, "eval_config": parse_assignments(args.eval_arg, "--eval-arg"),
        "group_by": key, "budget_minutes": args.budget_minutes, "max_steps": args.max_steps,
        "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "results": results,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2))
    table = markdown_table(results, key)
    (out / "results.md").write_text(f"# {args.task}: token accuracy by {key}\n\n{table}\n")
    write_plot(results, key, out / "accuracy.png", f"{args.task} {task_config or ''}")
    summary = Table(title=f"{args.task}: token accuracy (held-out, {args.eval_examples} examples) — {out}")
    for column in ("model", "params", "steps", "final loss", "accuracy"):
        summary.add_column(column)
    for r in results:
        summary.add_row(r["model"], f"{r['params']:,}", str(r["train"]["steps"]), f"{r['train']['final_loss']:.3f}", f"{r['eval']['token_accuracy']:.3f}")
    console.print(summary)
    console.print(table)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if isinstance(args, int):
        return args
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    try:
        run(args, console)
    except ValueError as exc:
        return usage_error("rcswarm bench diag", str(exc))
    except OSError as exc:
        return usage_error("rcswarm bench diag", f"{exc.filename or args.out}: cannot write the results: "
                                                 f"{exc.strerror or exc}")
    return 0
