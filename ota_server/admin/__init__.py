"""The operator's side: the admin HTTP API, its error mapping, and the server's Prometheus metrics."""
