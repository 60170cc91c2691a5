"""Slurm as a deploy target (issue 27)."""
