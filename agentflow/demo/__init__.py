"""`agentflow demo`: online retraining on a synthetic environment, with a live dashboard and a final report."""
