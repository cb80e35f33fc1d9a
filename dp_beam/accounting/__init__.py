"""Privacy accounting: budgets, ledger entries and their composition."""

from dp_beam.accounting.budget import Budget
from dp_beam.accounting.compose import check_budget, compose

__all__ = ["Budget", "check_budget", "compose"]
