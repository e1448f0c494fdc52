"""Deterministic simulation of DLedger members running the production core on simulated
machines: one seed, one replayable run."""

from hamq.sim.world import DEFAULT_STEPS, SimResult, failed_seeds, run_seed

__all__ = ["DEFAULT_STEPS", "SimResult", "failed_seeds", "run_seed"]
