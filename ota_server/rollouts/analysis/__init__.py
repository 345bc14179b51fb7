"""The canary judge: a rollout's stages judged on the figures their devices report, failing closed.

- :mod:`.figures`: one device's figures on one version, read from the traffic its agent reports;
- :mod:`.evidence`: what a stage is judged on (its devices, the baseline devices);
- :mod:`.baselines`: each board's baseline (live, kept from an earlier stage, the device's own
  previous version);
- :mod:`.devices`: each device's verdict (pass, fail, thin);
- :mod:`.stage`: the stage's verdict, board by board (passed, failed, inconclusive, waiting);
- :mod:`.rollback_rules`: which versions a group may be rolled back to, and how.

Pure functions over plain data (no store, no clock), so the engine, the API, the CLI, the console,
the tests and the benchmarks run the same rules.
"""
