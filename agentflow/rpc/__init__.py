"""gRPC plumbing shared by every service: server construction, health, reflection, error mapping, TLS, clients."""
