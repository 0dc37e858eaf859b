"""`rcswarm status --state-dir` shows the fit as `rcswarm fit` does: where the data do not identify a number,
"not enough data" and the caveats stand in its place, and no crossover is predicted from such a fit."""

from __future__ import annotations

import io
import re

import numpy as np

from rcswarm.cli import fit as fit_cli
from rcswarm.cli import status as status_cli
from rcswarm.observe.analysis import FitReport, fit_step_means
from rcswarm.protos.v1 import coordinator_pb2 as pb

LENGTHS = (32.0, 64.0, 128.0)


def step_means(last_step: int, seed: int = 0) -> FitReport:
    """(seq_len, step, loss, seconds) rows of loss(L | s) = A(s)·L^(−α(s)), α∞ = 0.3, τ = 100 steps, 0.01·L seconds
    per step, 1% noise, steps 1..last_step, fitted as `rcswarm status --state-dir` fits a store's step means."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in LENGTHS:
        for step in range(1, last_step + 1):
            alpha = 0.3 * (1 - np.exp(-step / 100.0))
            loss = (4.0 + 2.0 * np.exp(-step / 50.0)) * length ** -alpha * np.exp(rng.normal(0, 0.01))
            rows.append((length, float(step), float(loss), 0.01 * length * step))
    return fit_step_means(rows)


def printed(fits: FitReport) -> str:
    out = io.StringIO()
    status_cli.report(pb.GetStatusResponse(run_id="r"), status_cli.Console(file=out, width=400), fits, totals={})
    return out.getvalue()


def cells(text: str, quantity: str) -> list[str]:
    """The value cells of the rows named `quantity` in a printed table."""
    return [m.group(1).strip() for m in re.finditer(rf"│ {re.escape(quantity)}\s*│(.*?)│", text)]


def test_status_shows_not_enough_data_where_the_fit_has_caveats() -> None:
    """The newcomer's case: a fit from a few tens of steps per length. status printed α∞, τ and R² as numbers
    and predicted crossovers, while `rcswarm fit` on the same data said "not enough data" for all of them."""
    fits = step_means(30)
    assert fits.analysis is not None and fits.analysis.caveats, "the data rule must leave the fit unidentified"
    text = printed(fits)
    assert cells(text, "α∞ [90% interval]")[0].startswith("not enough data (fitted ")
    assert cells(text, "τ (steps) [90% interval]")[0].startswith("not enough data (fitted ")
    assert cells(text, "per doubling at α∞") == ["not enough data"]
    assert "not enough data: too few recorded steps" in text
    pairs = [line for line in text.splitlines() if "→" in line and "│" in line]
    assert len(pairs) == len(LENGTHS) - 1 and all("not enough data (the fit has caveats)" in p for p in pairs), text
    # The same rows as `rcswarm fit` prints for the same analysis: one rule, not a second copy of it.
    fit_out = io.StringIO()
    fit_cli.report(fits.analysis, fit_cli.Console(file=fit_out, width=400))
    for quantity in ("α∞ [90% interval]", "τ (steps) [90% interval]", "per doubling at α∞", "R² of α(s) fit"):
        assert cells(text, quantity) == cells(fit_out.getvalue(), quantity), quantity


def test_status_shows_the_numbers_of_a_fit_the_data_identify() -> None:
    fits = step_means(1000)
    assert fits.analysis is not None and not fits.analysis.caveats
    text = printed(fits)
    assert "not enough data" not in text
    assert re.fullmatch(r"0\.\d{4} \[0\.\d{4}, 0\.\d{4}\]", cells(text, "α∞ [90% interval]")[0]), text
    assert cells(text, "lengths") == ["32, 64, 128"]
