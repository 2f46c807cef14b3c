"""Environments to train the planner in: the tasks and tools (``synthetic``) and the profiles that decide which
engine answers each module (``profiles``: ``tiny-deterministic`` freezes executor, verifier, generator and the
generalist tool as rules, one engine per role, so that only the planner learns). Core code imports this package;
it imports nothing from the trainer."""
