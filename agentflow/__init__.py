"""AgentFlow: a trainable planner-executor-verifier-generator agent over an evolving memory."""

__version__ = "0.1.0"
