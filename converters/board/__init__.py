"""What a variant costs on the board: measured here, counted under emulation, measured on a fleet device.

``measure`` (a variant run in its own process on this host), ``emulate`` with ``userland`` and
``_guest_count`` (instructions counted on the board's own cores under qemu-user),
``board_latency`` (a count, a measurement or a scaled timing turned into the board's latency at
an operating point), ``gpu_estimate`` and ``accelerator_plan`` (a GPU's roofline), ``power``
(energy and the power budget) and ``remote`` (a real board of the fleet).
"""
