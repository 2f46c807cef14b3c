"""Generated protobuf and gRPC code for the agentflow.v1 contracts (protos/agentflow/v1).

Do not edit: regenerate with `python scripts/gen_protos.py`; tests/unit/test_protos.py checks for drift.
"""
