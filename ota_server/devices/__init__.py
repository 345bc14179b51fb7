"""What devices send and fetch: report ingest, per-device report limits, the chunk service, measurements,
freshness metadata, and the groups devices are provisioned in."""
