"""Deterministic simulation of the Raft core: one seed, one replayable run."""

from hamq.sim.world import DEFAULT_STEPS, SimResult, failed_seeds, run_seed

__all__ = ["DEFAULT_STEPS", "SimResult", "failed_seeds", "run_seed"]
