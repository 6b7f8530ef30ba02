"""control-node: a ROS-style real-time control-loop node.

One import name; the repository's top-level folders are mapped under it (pyproject.toml). Tiers, from
the bottom up; a module imports only its own tier and those below (tests/test_architecture.py checks it):

========================  ============================================================================
``kernels/``              ``control_node.kernels``: the policy kernel (C vector code, the thin Cython
                          ``Policy``, the model file format, the numpy reference). Imports nothing else.
``rundir.py``             every run-directory format: flag bits, reject reasons, ring fields, histogram
                          layout, format versions; the writer and reader of a node run.
``endpoints.py``          runtime dir, endpoint expansion, ipc paths, tcp hosts, packaged default configs.
``errors.py``             errors that end a command with a message, not a traceback.
``procfs.py``             every /proc and /sys read (CPU lists, interrupts, softirqs, stat, kernel threads,
                          cpuinfo, VM or not) under a root prefix; standard library only.
``loop/``                 the hot path: the nogil cycle (``_rtloop.pyx``), frame codec, histogram, libzmq
                          entry points, real-time set-up, the legged units (observation recipe, actuator
                          and modes). No GIL, nothing allocated per cycle, C ABI only.
``config.py``             the node config: TOML in, validated dict out (errors name the field and fix).
``deploy.py``             a legged node's deploy path from its [legged] recipe, checked against the policy
                          and the loop (``loop/legged.py``, ``loop/_legged.pyx``: recipe, PD, modes).
``security.py``           CURVE keys and the allow-list.
``sockets.py``            the node's bound ZeroMQ sockets.
``lifecycle.py``          policies loaded, switched, shadowed and rolled back while the loop runs: the
                          control endpoint's thread, resident policies, the transition log.
``metrics.py``            the node's Prometheus-style counters, read off the loop's thread.
``diagnosis/``            why a cycle was late (``attribution.py``) and ``doctor`` (a package of
                          registered checks); every /proc read through ``procfs.py``.
``node.py``               the node process: load, bind, set up real time, run the loop, write the run.
``report/``               ``control-node report``: load, statistics, .hgrm, terminal, HTML, plots.
``recording/``            record and replay: one MCAP format, its writer and its reader.
``monitor.py``            ``top`` / ``hz`` / ``echo``: subscribers of the node's streams.
``launch.py``             node + driver (+ recorder) from one TOML file.
``sim/``                  ``control_node.sim``: the simulator standing in for a robot. Never imported by
                          the node.
``train/``                ``control_node.train``: training the policies.
``bench/``                ``control_node.bench``: benchmarks against peers, and the node-process harness
                          they start nodes with (``bench/harness.py``; the tests reuse it, their own
                          helpers and child scripts are in ``tests/support/``).
``bridge/``               ``control_node.bridge``: the ROS 2 bridge process and rosbag2 export. A tool:
                          the only code besides the ROS 2 simulator that imports rclpy.
``live/``                 ``control_node.live``: the live view, a Foxglove WebSocket server of the node's
                          streams in a process of its own. A tool: never imported by the node.
``configs/``              ``control_node.configs``: the packaged default configs (importlib.resources).
``cli.py``, ``verbs/``    the composition root: one verb per module; the only code that imports
                          sim, train and bench.
========================  ============================================================================
"""
