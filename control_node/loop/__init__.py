"""The hot path: the nogil cycle and what it calls.

Rules for every module here:

- **No GIL, no Python objects per cycle.** ``_rtloop.pyx`` runs the whole cycle (wait for the tick, read,
  infer, write, record) in ``nogil`` code; Python only builds it and reads its results afterwards.
- **Nothing allocated per cycle.** Buffers, rings and histograms are created before the loop starts.
- **C ABI only.** libzmq is called through function pointers (``libzmq.py`` takes them from the library
  pyzmq loaded), frames are decoded by ``frame_codec.h``, histograms are ``rt_hist.h``, the policy is the
  kernel's nogil entry point.
- **Imports point down only:** this package imports ``control_node.rundir`` (the formats it writes),
  ``control_node.errors`` and ``control_node.kernels``, nothing else of ``control_node``
  (tests/test_architecture.py checks it).

``realtime.py`` sets up the loop thread (pinning, SCHED_FIFO, mlockall, cpu_dma_latency) and reports what
the OS granted.
"""
