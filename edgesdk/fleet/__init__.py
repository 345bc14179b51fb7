"""The fleet wire: what the OTA server, the device agent and the operator's tools say to each other.

- :mod:`~edgesdk.fleet.protocol`: the MQTT topics, signed commands and update archives.
- :mod:`~edgesdk.fleet.measurement`: the archive a measure command carries and the results a device sends back.
- :mod:`~edgesdk.fleet.records`: the fleet vocabulary (statuses, rollout records and policies) of the admin API.
- :mod:`~edgesdk.fleet.transport`: the MQTT transport (paho, MQTT 5), reconnecting and re-subscribing.
- :mod:`~edgesdk.fleet.chunking`, :mod:`~edgesdk.fleet.chunk_codec`: content-defined chunks and per-chunk zstd.
- :mod:`~edgesdk.fleet.admin_client`: the admin API's HTTP client for the CLI and scripts.

It builds on :mod:`edgesdk.runtime`'s bundle contract and imports nothing from :mod:`edgesdk.agent`
(``tests/unit/test_layers.py``).
"""
