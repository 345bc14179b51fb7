"""On-device inference: everything a device needs to run a model, with no fleet and no agent.

- :mod:`~edgesdk.runtime.runtime`: :class:`~edgesdk.Runtime`, the model runner (validation, scheduling, stats).
- :mod:`~edgesdk.runtime.backends`: LiteRT and ONNX Runtime behind one ``Backend`` interface, delegates and fallback.
- :mod:`~edgesdk.runtime.profiles`, :mod:`~edgesdk.runtime.board_power`: device profiles (clusters, power modes,
  memory, the power sensor); :mod:`~edgesdk.runtime.detect`: which profile this board is;
  :mod:`~edgesdk.runtime.scheduling`: threads pinned to big or little cores.
- :mod:`~edgesdk.runtime.tensors`, :mod:`~edgesdk.runtime.preprocess`, :mod:`~edgesdk.runtime.model_file`: input
  signatures and validation, declared preprocessing, model files read without half-written bytes.
- :mod:`~edgesdk.runtime.stats`, :mod:`~edgesdk.runtime.bench`, :mod:`~edgesdk.runtime.measure_worker`,
  :mod:`~edgesdk.runtime.memory`, :mod:`~edgesdk.runtime.energy`: latency, memory and energy figures.
- The bundle contract, since a device verifies a bundle without the fleet: :mod:`~edgesdk.runtime.bundle`
  (manifest, hashes, health sample) and :mod:`~edgesdk.runtime.signing` (Ed25519).
- :mod:`~edgesdk.runtime.async_predictions`: ``predict_async``, the one seam through which a runtime reaches
  :mod:`edgesdk.offload` (imported when a dispatcher is first made).

Nothing here imports :mod:`edgesdk.fleet` or :mod:`edgesdk.agent` (``tests/unit/test_layers.py``). The module has
no imports of its own, so ``edgesdk.runtime.profiles`` does not pay for the backends.
"""
