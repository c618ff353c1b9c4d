"""The sidecar: ``hangwatch watch`` keeps a rolling verdict and serves it to orchestrators and Prometheus."""
